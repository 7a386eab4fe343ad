"""parallel_model_trace / parallel_model_save / parallel_model_load (test double).

Every rank is compiled one after the other in this process, each through the neuronx-cc
subprocess, into <compiler_workdir>/_tp<rank>/. Each rank's model is the whole, unsharded model
that `func()` returns; calling the result runs every rank and returns rank 0's output.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from typing import Callable, List

import torch

import torch_neuronx  # noqa: F401  (registers the runtime op the saved ranks call)
from torch_neuronx import _fake_impl


class TensorParallelNeuronModel(torch.nn.Module):
    def __init__(self, models: List[torch.jit.ScriptModule]) -> None:
        super().__init__()
        self.models = torch.nn.ModuleList(models)
        self.tp_degree = len(models)

    def forward(self, *tensors):
        outputs = [model(*tensors) for model in self.models]
        return outputs[0]


def parallel_model_trace(func: Callable, example_inputs, compiler_workdir=None, compiler_args=None,
                         inline_weights_to_neff=True, bucket_config=None, tp_degree=1, **kwargs):
    """Compile one NEFF per tensor-parallel rank. `func()` must return (model, input_output_aliases)."""
    if kwargs:
        warnings.warn(f"parallel_model_trace: ignoring unexpected keyword arguments {sorted(kwargs)}",
                      UserWarning)
    if bucket_config is not None:
        raise NotImplementedError("the neuronx-distributed test double does not implement bucket_config")
    if not isinstance(tp_degree, int) or tp_degree < 1:
        raise ValueError(f"tp_degree must be a positive int, got {tp_degree!r}")
    if not _fake_impl.has_neuron_device():
        raise _fake_impl._no_device_error()
    base_args = _fake_impl._normalize_args(compiler_args)

    holder = None
    if compiler_workdir is None:
        holder = tempfile.TemporaryDirectory(prefix="fake-nxd-")
        compiler_workdir = holder.name
    try:
        models = []
        for rank in range(tp_degree):
            model, aliases = func()
            workdir = os.path.join(os.path.abspath(os.fspath(compiler_workdir)), f"_tp{rank}")
            os.makedirs(workdir, exist_ok=True)
            args = list(base_args)
            if not any(a == "--logfile" or a.startswith("--logfile=") for a in args):
                args.append(f"--logfile={os.path.join(workdir, 'log-neuron-cc.txt')}")
            models.append(_fake_impl._compile(
                model, example_inputs, input_output_aliases=aliases, compiler_workdir=workdir,
                compiler_args=args, inline_weights_to_neff=inline_weights_to_neff,
                check_device=False,
                extra_files={"metaneff.pb": f"fake metaneff rank {rank}/{tp_degree}\n".encode()},
            ))
    finally:
        if holder is not None:
            holder.cleanup()
    return TensorParallelNeuronModel(models)


def parallel_model_save(model: TensorParallelNeuronModel, path) -> None:
    os.makedirs(path, exist_ok=True)
    for rank, rank_model in enumerate(model.models):
        torch.jit.save(rank_model, os.path.join(path, f"tp_{rank}.pt"))


def parallel_model_load(path) -> TensorParallelNeuronModel:
    ranks = {}
    for name in os.listdir(path):
        match = re.fullmatch(r"tp_(\d+)\.pt", name)
        if match:
            ranks[int(match.group(1))] = os.path.join(path, name)
    if not ranks:
        raise FileNotFoundError(f"no tp_<rank>.pt files in {path}")
    if sorted(ranks) != list(range(len(ranks))):
        raise FileNotFoundError(f"missing ranks in {path}: found {sorted(ranks)}")
    return TensorParallelNeuronModel([torch.jit.load(ranks[r]) for r in range(len(ranks))])
