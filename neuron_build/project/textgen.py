"""NxDI's configuration of a text-generation target (``backend = "neuron"``): torch-free, part of the key.

One NxDI compile (``NeuronLlamaForCausalLM.compile(dir)``) builds every context-encoding (prefill) and
token-generation (decode) bucket of one batch size into one folder, so on the neuron backend a
text-generation model has one target per batch size (``llama/nxdi-b1/bf16/p1``) whose key holds the
``NeuronConfig`` below. Fields and defaults [code: NxDI models/config.py, shared notes 1.2]:
``context_encoding_buckets`` = the model's ``seq`` buckets (``max_context_length`` their largest),
``token_generation_buckets`` = ``decode_buckets`` or ``[max_seq_len]`` (``seq_len`` = ``max_seq_len``),
``enable_bucketing`` on, greedy on-device sampling (``top_k = 1``), ``logical_nc_config`` 2 on trn2/trn3
and 1 elsewhere (NxDI's platform default), ``tp_degree`` from the profile, and ``save_sharded_checkpoint``:
``compile()`` shards the checkpoint into the artifact's ``weights/`` and ``load()`` reads it from there, so a
release needs no checkpoint folder of the build host (:mod:`neuron_build.compilers.neuron.nxdi_weights`).
"""

from __future__ import annotations

from typing import Any

#: target dtype -> NxDI ``torch_dtype`` (a string NeuronConfig accepts).
NXDI_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def neuron_config(spec, batch: int, dtype: str, tp_degree: int, hardware_target: str) -> dict[str, Any]:
    """The ``NeuronConfig`` keyword arguments of one NxDI target (JSON values; see the module docstring)."""
    seqs = sorted(spec.buckets.get("seq", ()))
    return {
        "tp_degree": int(tp_degree), "batch_size": int(batch), "seq_len": int(spec.max_seq_len),
        "max_context_length": int(seqs[-1]), "enable_bucketing": True, "context_encoding_buckets": seqs,
        "token_generation_buckets": sorted(spec.decode_buckets) or [int(spec.max_seq_len)],
        "torch_dtype": NXDI_DTYPES[dtype],
        "on_device_sampling_config": {"do_sample": False, "top_k": 1},
        "logical_nc_config": 2 if hardware_target in ("trn2", "trn3") else 1,
        "save_sharded_checkpoint": True,
    }


__all__ = ["NXDI_DTYPES", "neuron_config"]
