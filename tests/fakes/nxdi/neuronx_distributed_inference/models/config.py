"""NeuronConfig, OnDeviceSamplingConfig, InferenceConfig: the fields and checks neuron-build relies on,
with the real defaults (shared notes 1.2, NxDI models/config.py). Standard library only (torch_dtype is
kept as its name)."""

from __future__ import annotations

import json
import os

_DTYPES = {"bfloat16": "bfloat16", "torch.bfloat16": "bfloat16", "float32": "float32", "torch.float32": "float32",
           "float16": "float16", "torch.float16": "float16"}


class OnDeviceSamplingConfig:
    def __init__(self, do_sample=False, top_k=1, top_p=1.0, temperature=1.0, dynamic=False, deterministic=False,
                 global_topk=256, **kwargs):
        self.do_sample, self.top_k, self.top_p, self.temperature = do_sample, top_k, top_p, temperature
        self.dynamic, self.deterministic, self.global_topk = dynamic, deterministic, global_topk
        self.__dict__.update(kwargs)

    def to_dict(self):
        return dict(self.__dict__)


def record(call: str, **fields) -> None:
    """Append one JSON line ``{"call": ..., **fields}`` to $FAKE_NXDI_CALLS when it is set."""
    path = os.environ.get("FAKE_NXDI_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"call": call, **fields}, sort_keys=True, default=repr) + "\n")


class NeuronConfig:
    def __init__(self, **kwargs):
        record("NeuronConfig", kwargs={k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in kwargs.items()})
        self.batch_size = kwargs.pop("batch_size", 1)
        self.seq_len = kwargs.pop("seq_len", 128)
        self.max_context_length = kwargs.pop("max_context_length", None) or self.seq_len
        self.max_length = kwargs.pop("max_length", self.seq_len)
        if self.max_context_length > self.max_length:
            raise ValueError(f"max_context_length={self.max_context_length} must be <= max_length={self.max_length}")
        self.overrides_torch_dtype = "torch_dtype" in kwargs  # an explicit dtype wins over the HF config's
        dt = kwargs.pop("torch_dtype", "bfloat16")
        self.torch_dtype = _DTYPES.get(str(dt), str(dt))
        self.enable_bucketing = kwargs.pop("enable_bucketing", False)
        self.context_encoding_buckets = kwargs.pop("context_encoding_buckets", None)
        self.token_generation_buckets = kwargs.pop("token_generation_buckets", None)
        for name, top in (("context_encoding_buckets", self.max_context_length),
                          ("token_generation_buckets", self.max_length)):
            b = getattr(self, name)
            if b is not None:
                b = sorted(b)
                setattr(self, name, b)
                if b[-1] > top:
                    raise ValueError(f"{name} {b}: the last bucket must be <= {top}")
        odsc = kwargs.pop("on_device_sampling_config", None)
        self.on_device_sampling_config = OnDeviceSamplingConfig(**odsc) if isinstance(odsc, dict) else odsc
        self.tp_degree = kwargs.pop("tp_degree", 1)
        self.pp_degree = kwargs.pop("pp_degree", 1)
        self.ep_degree = kwargs.pop("ep_degree", 1)
        self.world_size = self.tp_degree * self.pp_degree * self.ep_degree
        self.save_sharded_checkpoint = kwargs.pop("save_sharded_checkpoint", False)
        self.skip_sharding = kwargs.pop("skip_sharding", False)
        env_lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
        self.logical_nc_config = int(env_lnc) if env_lnc else kwargs.pop("logical_nc_config", 1)
        kwargs.pop("logical_nc_config", None)
        self.cc_pipeline_tiling_factor = kwargs.pop("cc_pipeline_tiling_factor", 2)
        self.__dict__.update(kwargs)

    def to_dict(self):
        out = {}
        for k, v in self.__dict__.items():
            out[k] = v.to_dict() if hasattr(v, "to_dict") else v
        return out


class InferenceConfig:
    """The model's config: the NeuronConfig plus the HF fields ``load_config`` copies onto it."""

    def __init__(self, neuron_config, fused_spec_config=None, load_config=None, **kwargs):
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        self.__dict__.update(kwargs)
        missing = [a for a in self.get_required_attributes() if not hasattr(self, a)]
        if missing:
            raise AssertionError(f"Config must define {missing}")

    def get_required_attributes(self):
        return []

    def to_dict(self):
        out = {}
        for k, v in self.__dict__.items():
            out[k] = v.to_dict() if hasattr(v, "to_dict") else v
        return out

    def save(self, model_directory):
        os.makedirs(model_directory, exist_ok=True)
        with open(os.path.join(model_directory, "neuron_config.json"), "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def load(cls, model_directory, **kwargs):
        with open(os.path.join(model_directory, "neuron_config.json")) as f:
            data = json.load(f)
        nc = data.pop("neuron_config")
        nc.pop("world_size", None)
        nc.pop("overrides_torch_dtype", None)
        data.pop("fused_spec_config", None)
        obj = cls.__new__(cls)
        obj.neuron_config = NeuronConfig(**nc)
        obj.fused_spec_config = None
        obj.__dict__.update(data)
        obj.__dict__.update(kwargs)
        return obj
