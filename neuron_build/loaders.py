"""The names a compiled artifact is loaded by, and the dtype names of its inputs: one table each, read by the
compilers that record them (in the manifest's ``compiler`` section, then in release records and a pulled
folder's ``release.json``) and by every reader that checks a record (:mod:`neuron_build.runtime.pulled`).

Core module: no torch (the names only; :func:`neuron_build.artifact.load_artifact` loads).
"""

from __future__ import annotations

#: AOTInductor packages (``.pt2``).
AOTI_LOADER = "torch._inductor.aoti_load_package"
#: compile-cache and torchneuron artifacts (``save_cache_artifacts()`` bytes: caches, not models).
CACHE_LOADER = "torch.compiler.load_cache_artifacts"
#: TorchScript modules (``.pt``).
JIT_LOADER = "torch.jit.load"
#: A Neuron TorchScript module (the NEFF inside), one NeuronCore: ``torch_neuronx`` registers its classes.
NEURON_JIT_LOADER = "import torch_neuronx; torch.jit.load('model.pt')"
#: A tensor-parallel Neuron model: one TorchScript module per rank (``tp_<r>.pt``).
NEURON_TP_LOADER = "import torch_neuronx; neuronx_distributed.trace.parallel_model_load(<artifact folder>)"
#: A Neuron model compiled with its weights outside the NEFF, put back by ``torch_neuronx.replace_weights``.
NEURON_EXTERNAL_WEIGHTS_LOADER = ("import torch_neuronx; m = torch.jit.load('model.pt'); "
                                  "torch_neuronx.replace_weights(m, safetensors.torch.load_file('weights.safetensors'))")
#: An NxDI compile (a ``neuronx_distributed_inference`` model folder).
NXDI_LOADER = "neuronx_distributed_inference:load"
#: Every loader a compiler of this neuron-build records; a record naming another is not one it wrote.
LOADERS = frozenset({AOTI_LOADER, CACHE_LOADER, JIT_LOADER, NEURON_JIT_LOADER, NEURON_TP_LOADER,
                     NEURON_EXTERNAL_WEIGHTS_LOADER, NXDI_LOADER})

#: Our dtype names -> the ``torch`` dtype attribute (``"bf16"`` -> ``torch.bfloat16``): what an input spec's
#: ``dtype`` may be.
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int64": "int64", "int32": "int32",
                "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}

__all__ = ["AOTI_LOADER", "CACHE_LOADER", "JIT_LOADER", "LOADERS", "NEURON_EXTERNAL_WEIGHTS_LOADER",
           "NEURON_JIT_LOADER", "NEURON_TP_LOADER", "NXDI_LOADER", "TORCH_DTYPES"]
