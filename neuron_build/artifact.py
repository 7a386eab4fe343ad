"""Which file of an artifact is the loadable model, with which loader, and loading it.

One place for the three readers of compiled artifacts: releases (which file and loader a release records
per bucket), validation and benchmarks (the artifact in the store, on its device) and the runtime (a pulled
release's buckets).

- **File**: the ``artifact`` the compiler recorded in the manifest's ``compiler`` section when the
  artifact holds that file, else ``model.pt2`` or ``model.pt`` (the first the artifact holds).
- **Loader**: the ``loader`` the compiler recorded, else by suffix: ``torch._inductor.aoti_load_package``
  for ``.pt2`` (AOTInductor), ``torch.jit.load`` for ``.pt`` (TorchScript; Neuron artifacts are
  TorchScript modules holding the NEFF and are placed on a NeuronCore when loaded [doc: toolchain notes]).

Core module: torch is imported only inside :func:`load_artifact`.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError

#: The loader of AOTInductor packages (``.pt2``).
AOTI_LOADER = "torch._inductor.aoti_load_package"
#: The loader of TorchScript modules (``.pt``), Neuron artifacts included.
JIT_LOADER = "torch.jit.load"
#: The model files looked for, in this order, when the compiler recorded none the artifact holds.
MODEL_FILES = ("model.pt2", "model.pt")


def artifact_file(compiler: Mapping[str, Any] | None, files: Collection[str]) -> tuple[str, str] | None:
    """(file name, loader) of the loadable model among an artifact's files, or None when it holds none.

    Args:
        compiler: the manifest's ``compiler`` section (``artifact``: file name, ``loader``: how to load it;
            either may be missing, and a multi-file ``artifact`` list is not a single loadable file).
        files: the names of the artifact's files (the manifest's ``files``).
    """
    comp = compiler or {}
    name, loader = comp.get("artifact"), comp.get("loader")
    if not isinstance(name, str) or not name or name not in files:
        name = next((n for n in MODEL_FILES if n in files), None)
    if name is None:
        return None
    if not loader:
        loader = AOTI_LOADER if name.endswith(".pt2") else JIT_LOADER
    return name, loader


def load_artifact(path: str | Path, loader: str, backend: str, device: str | None = None, *,
                  explain_missing_neuronx: bool = True) -> Any:
    """Load a compiled model file and return the callable module.

    ``.pt2`` files (or ``loader`` :data:`AOTI_LOADER`) go to ``torch._inductor.aoti_load_package``; anything
    else to ``torch.jit.load`` (its deprecation warning of torch 2.9+ silenced: Neuron artifacts need it),
    after ``import torch_neuronx`` for the neuron backend, which registers the Neuron TorchScript classes and
    places the NEFF on a NeuronCore [doc].

    Args:
        path: the model file.
        loader: the loader a release or manifest recorded (see :func:`artifact_file`).
        backend: ``inductor``, ``torchscript`` or ``neuron``.
        device: for TorchScript artifacts of other backends than neuron, the ``map_location`` (``cpu``,
            ``cuda``); None loads onto the device the module was saved from.
        explain_missing_neuronx: True: a missing torch-neuronx is a :class:`UserError` naming the file;
            False: its ``ImportError`` propagates (validation records it as the artifact failing to load).

    Raises:
        UserError: a neuron artifact and no torch-neuronx here (with ``explain_missing_neuronx``).
        ImportError: the same, without it.
    """
    import torch

    path = Path(path)
    if loader == AOTI_LOADER or path.suffix == ".pt2":
        return torch._inductor.aoti_load_package(str(path))
    if backend == "neuron":
        try:
            import torch_neuronx  # noqa: F401  registers the Neuron TorchScript classes
        except ImportError as e:
            if not explain_missing_neuronx:
                raise
            raise UserError(f"{path} was compiled for Neuron; loading it needs torch-neuronx on a "
                            f"Neuron host ({e})") from None
        device = None
    with warnings.catch_warnings():  # torch 2.9+ flags torch.jit.load as deprecated; Neuron artifacts need it
        warnings.simplefilter("ignore", DeprecationWarning)
        if device is None:
            return torch.jit.load(str(path))
        return torch.jit.load(str(path), map_location=device)


__all__ = ["AOTI_LOADER", "JIT_LOADER", "MODEL_FILES", "artifact_file", "load_artifact"]
