"""load_pretrained_config: the hook that copies an HF config.json onto an InferenceConfig and takes the
HF dtype unless the user gave torch_dtype (shared notes 1.1, NxDI utils/hf_adapter.py); and
HuggingFaceGenerationAdapter, which lets transformers' generate() drive a loaded application (shared notes
hlo-before-neff 4: generate() calls neuron_model.reset() first). Here greedy decoding over the double's
next_token(); the input batch must be the compiled batch_size [guess: NxDI pads smaller batches itself]."""

from __future__ import annotations

import json
import os

from neuronx_distributed_inference.models.config import record


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


class HuggingFaceGenerationAdapter:
    def __init__(self, model, input_start_offsets=None):
        record("adapter", app=type(model).__name__)
        if not getattr(model, "is_loaded_to_neuron", False):
            raise RuntimeError("the model is not loaded to Neuron; call model.load(path) first")
        self.neuron_model = model

    def generate(self, input_ids, attention_mask=None, max_new_tokens=None, min_new_tokens=None, do_sample=False,
                 eos_token_id=None, pad_token_id=None, **kwargs):
        import torch

        nc = self.neuron_model.neuron_config
        record("generate", shape=list(input_ids.shape), max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens,
               do_sample=do_sample, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
               attention_mask=None if attention_mask is None else attention_mask.tolist())
        if input_ids.shape[0] != nc.batch_size:
            raise ValueError(f"batch {input_ids.shape[0]} != compiled batch_size {nc.batch_size}")
        if input_ids.shape[1] > nc.max_context_length:
            raise ValueError(f"prompt of {input_ids.shape[1]} tokens > max_context_length {nc.max_context_length}")
        self.neuron_model.reset()
        eos = eos_token_id if eos_token_id is not None else getattr(self.neuron_model.config, "eos_token_id", None)
        pad = pad_token_id if pad_token_id is not None else eos
        rows = []
        for r in range(input_ids.shape[0]):
            last, out, done = int(input_ids[r, -1]), [], False
            for step in range(max_new_tokens):
                tok = pad if done else self.neuron_model.next_token(last, step)
                if not done and eos is not None and tok == eos and step + 1 < (min_new_tokens or 0):
                    tok = (tok + 1) % int(self.neuron_model.config.vocab_size)
                out.append(tok)
                done = done or (eos is not None and tok == eos)
                last = tok
            rows.append(out)
        new = torch.tensor(rows, dtype=torch.long)
        if eos is not None:  # stop when every row has met eos
            alive = [i for i in range(new.shape[1]) if not all(eos in row[:i] for row in rows)]
            new = new[:, :max(alive) + 1] if alive else new[:, :1]
        return torch.cat([input_ids, new], dim=1)
