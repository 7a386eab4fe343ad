"""load_pretrained_config: the hook that copies an HF config.json onto an InferenceConfig and takes the
HF dtype unless the user gave torch_dtype (shared notes 1.1, NxDI utils/hf_adapter.py)."""

from __future__ import annotations

import json
import os


def load_pretrained_config(model_path_or_name=None, hf_config=None):
    def load_config(self):
        if hf_config is not None:
            data = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
        else:
            with open(os.path.join(model_path_or_name, "config.json")) as f:
                data = json.load(f)
        dtype = data.pop("dtype", None) or data.pop("torch_dtype", None)
        if dtype and not getattr(self.neuron_config, "overrides_torch_dtype", False):
            self.neuron_config.torch_dtype = str(dtype)
        rope = data.get("rope_parameters") or {}
        if "rope_theta" not in data and "rope_theta" in rope:  # transformers 5 nests it [guess: how NxDI reads it]
            data["rope_theta"] = rope["rope_theta"]
        data["_name_or_path"] = model_path_or_name
        self.__dict__.update(data)
    return load_config
