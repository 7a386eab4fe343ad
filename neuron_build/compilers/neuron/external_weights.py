"""External weights on the XLA path: the structure part of the HLO key, the weights beside ``model.pt``, and
``replace_weights`` at load (issue 38, item 2, for the ``neuron`` backend).

A profile with ``weights = "external"`` (Neuron spelling ``inline_weights_to_neff = false``) traces with
``inline_weights_to_neff=False``. torch-xla lowers every weight to an HLO **parameter**, so the HLO module,
and the NEFF compiled from it, do not depend on weight values [ran: shared/weights-and-real-hlo.md 1.4,
seed 7 gave identical HLO bytes]. ``torch_neuronx.replace_weights(neuron_model, state_dict)`` swaps the values
of such a model in place [doc: torch-neuronx API reference, replace_weights].

- **The key** (:class:`ExternalNeffHook`, the ``generate_neff`` hook of
  :mod:`~neuron_build.compilers.neuron.hlo_key`): :func:`structure_document` is the HLO document with each
  weight of the model's state dict as ``[name, dtype, shape, HLO parameter number]`` (from
  ``HloArtifacts.weight_name_to_idx``, which NxD reads as name -> parameter index [code: NxD
  ``hlo_utils.add_weight_idx_attr_to_hlo``]) and never by value. What is not a weight of the state dict stays
  by content: an inlined constant parameter, a separated tensor the state dict does not name (a
  non-persistent buffer). A fine-tune of the same architecture is the same structure: relinked
  (:mod:`neuron_build.build.graph.relink`), 0 neuronx-cc runs.
- **Fail closed** (:func:`separable`): a weight of the state dict that is not a parameter of the entry
  computation (inlined, or a second name of a tied weight), a dtype or shape that differs from the one
  lowered, no ``weight_name_to_idx``: the weights stay in the key by value and the artifact is recorded
  ``weights = "inline"`` (never a relink source).
- **The files**: ``weights.safetensors`` + ``weights.json`` beside ``model.pt``
  (:func:`neuron_build.compilers.weights.write`), staged before the key is asked, so a hit relinks them.
- **Loading** (:func:`replace_into`): ``model.pt`` is the compiled part and holds the values it was traced
  with; the loader checks ``weights.safetensors`` against ``weights.json`` before anything is loaded, then
  calls ``torch_neuronx.replace_weights``. Why at load and not at relink (``torch.jit.load`` +
  ``replace_weights`` + ``torch.jit.save`` on the build host): the docs show ``replace_weights`` on a
  traced model in a process that runs it; whether it works on a model loaded without a NeuronCore
  (``disable_nrt_load``) is unknown [guess: shared/weights-and-real-hlo.md 3.6], and a relink at load
  needs neither torch-neuronx nor a worker on the build host. Weights must then be placed on the device
  (``move_trace_to_device``) or every call copies them [doc: toolchain notes].
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from neuron_build.compilers import weights
from neuron_build.compilers.neuron import hlo_key
from neuron_build.loaders import NEURON_EXTERNAL_WEIGHTS_LOADER

#: The structure document's kind (the inline one is ``neuron-hlo``).
STRUCTURE_KIND = "neuron-hlo-structure"
#: The loader the manifest records for an external-weights artifact.
LOADER = NEURON_EXTERNAL_WEIGHTS_LOADER


def model_state(model: Any) -> dict[str, Any]:
    """The weights ``replace_weights`` takes for ``model``: its ``state_dict()`` (parameters and persistent
    buffers by FQN, a tied weight under each of its names)."""
    return dict(model.state_dict())


def _dtype(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _entry_parameters(module: Any) -> set[int]:
    """The parameter numbers of the entry computation of an ``HloModuleProto``."""
    entry = next(c for c in module.computations if int(c.id) == int(module.entry_computation_id))
    return {int(i.parameter_number) for i in entry.instructions if i.opcode == "parameter"}


def separable(hlo_artifacts: Any, state: Mapping[str, Any]) -> str | None:
    """Why the weights ``state`` (FQN -> tensor) cannot be kept out of the compiled part of this lowering
    (``generate_hlo``'s ``HloArtifacts``), or None when every one of them is a separated weight bound to its
    own parameter of the entry computation with the model's dtype and shape. One line."""
    separated = getattr(hlo_artifacts, "weights", None)
    index = getattr(hlo_artifacts, "weight_name_to_idx", None)
    if not isinstance(separated, Mapping) or not isinstance(index, Mapping):
        return "generate_hlo returned no separated weights with their HLO parameter numbers"
    if not state:
        return "the model has no weights"
    try:
        params = _entry_parameters(hlo_artifacts.hlo_module)
    except (AttributeError, StopIteration, TypeError, ValueError):
        return "the lowered HLO module has no readable entry computation"
    bound: set[int] = set()
    for name, t in state.items():
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            return f"{name} of the model's state_dict() is a {type(t).__name__}, not a tensor"
        w, i = separated.get(name), index.get(name)
        if w is None or i is None:
            return f"weight {name} is not a parameter of the lowered HLO module (inlined, or a second name of " \
                   "another weight)"
        if not hasattr(w, "shape") or _dtype(w) != _dtype(t) or list(w.shape) != list(t.shape):
            return (f"weight {name} was lowered as {_dtype(w)} {list(getattr(w, 'shape', []))} but the model "
                    f"holds {_dtype(t)} {list(t.shape)}")
        if int(i) not in params:
            return f"weight {name} is bound to HLO parameter {int(i)}, which the entry computation does not have"
        bound.add(int(i))
    if len(bound) != len(state):
        return "two weights of the model are bound to one HLO parameter"
    return None


def _number(k: Any) -> int | None:
    try:
        return int(k)
    except (TypeError, ValueError):
        return None


def structure_document(hlo_artifacts: Any, state: Mapping[str, Any], compiler_args: Any,
                       compiler_version: str | None) -> dict[str, Any]:
    """The structure part of the HLO key (call after :func:`separable` said None): the document of
    :func:`~neuron_build.compilers.neuron.hlo_key.hlo_document` without the values of ``state``'s weights,
    plus ``weights``: ``[[name, dtype, shape, HLO parameter number]]`` in parameter order. Inlined constant
    parameters that are no weight of ``state``, and separated tensors ``state`` does not name, stay by
    content.

    Raises:
        NoGraphKey: as :func:`~neuron_build.compilers.neuron.hlo_key.hlo_document`.
    """
    index = hlo_artifacts.weight_name_to_idx
    bound = {int(index[n]) for n in state}
    constants = getattr(hlo_artifacts, "constant_parameter_tensors", None) or {}
    view = SimpleNamespace(
        hlo_module=hlo_artifacts.hlo_module, metaneff=hlo_artifacts.metaneff, flattener=hlo_artifacts.flattener,
        packer=hlo_artifacts.packer,
        constant_parameter_tensors={k: v for k, v in constants.items() if _number(k) not in bound},
        weights={k: v for k, v in hlo_artifacts.weights.items() if k not in state})
    doc = hlo_key.hlo_document(view, compiler_args, False, compiler_version)
    doc["kind"] = STRUCTURE_KIND
    doc["weights"] = sorted(([n, _dtype(t), [int(d) for d in t.shape], int(index[n])] for n, t in state.items()),
                            key=lambda w: w[3])
    return doc


def unstage(folder: str | Path) -> None:
    """Remove the weights files from ``folder`` (the artifact keeps its weights inline)."""
    for name in (weights.WEIGHTS_FILE, weights.SPEC_FILE):
        (Path(folder) / name).unlink(missing_ok=True)


class ExternalNeffHook(hlo_key.NeffHook):
    """The ``generate_neff`` hook of a profile with external weights: before the key is asked it checks that
    every weight is an HLO parameter (:func:`separable`) and writes the weights files into ``folder`` (the
    artifact's staging folder: a hit relinks them); the key is then :func:`structure_document`. When the
    weights cannot be kept apart, ``inline_why`` says why, nothing is staged and the key is the inline one.

    Attributes:
        inline_why: why the artifact keeps its weights inline (None: external); set when the hook runs.
    """

    def __init__(self, module: Any, request: Any, compiler_version: str | None, model: Any, folder: str | Path):
        super().__init__(module, request, compiler_version)
        self.folder = Path(folder)
        self.inline_why: str | None = "torch_neuronx.trace did not call generate_neff"
        try:
            self.state, self.state_error = model_state(model), None
        except Exception as e:  # an unreadable state dict: the weights stay inline
            self.state, self.state_error = {}, f"the model's state_dict() cannot be read ({type(e).__name__}: {e})"

    def __call__(self, hlo_artifacts, compiler_workdir=None, compiler_args=None, inline_weights_to_neff=True,
                 *args, **kwargs):
        self.inline_why = self._stage(hlo_artifacts, inline_weights_to_neff)
        return super().__call__(hlo_artifacts, compiler_workdir, compiler_args, inline_weights_to_neff,
                                *args, **kwargs)

    def document(self, hlo_artifacts, compiler_args, inline_weights_to_neff) -> dict[str, Any]:
        """:func:`structure_document` when the weights are staged apart, else the inline document."""
        if self.inline_why is not None:
            return super().document(hlo_artifacts, compiler_args, inline_weights_to_neff)
        return structure_document(hlo_artifacts, self.state, compiler_args, self.compiler_version)

    def _stage(self, hlo_artifacts: Any, inline_weights_to_neff: bool) -> str | None:
        why = ("trace was asked to inline the weights" if inline_weights_to_neff
               else self.state_error or separable(hlo_artifacts, self.state))
        if why is None:
            try:
                weights.write(self.folder, self.state)
            except Exception as e:  # a dtype safetensors cannot hold, a full disk: the weights stay inline
                why = f"the weights cannot be written apart ({type(e).__name__}: {str(e)[:200]})"
        if why is not None:
            unstage(self.folder)
            print(f"warning: {why}: the weights stay in the compiled part and in the key", flush=True)
        return why


def replace_into(module: Any, folder: str | Path, state: dict[str, Any] | None = None) -> Any:
    """Put ``folder``'s external weights into a loaded Neuron model (``torch.jit.load`` of its ``model.pt``)
    with ``torch_neuronx.replace_weights`` [doc]; returns ``module``. The caller checked the weights file
    against the spec before loading (:func:`neuron_build.compilers.weights.problem`). ``state``: the file's
    tensors already read (:class:`neuron_build.compilers.weights.SharedWeights`: one read per process for
    every bucket of a release; ``replace_weights`` puts them into each model, on a NeuronCore one device
    copy per model); None: the file is read here.

    Raises:
        UserError: one line naming the file: no ``replace_weights`` in the installed torch-neuronx (SDK 2.16
            added separated weights [doc]), ``replace_weights`` raising, or warning (the documented warning
            for a model without separated weights: it would serve the values it was traced with).
    """
    import torch_neuronx
    from safetensors.torch import load_file

    from neuron_build.errors import UserError

    path = Path(folder) / weights.WEIGHTS_FILE
    fn = getattr(torch_neuronx, "replace_weights", None)
    if not callable(fn):
        raise UserError(f"{path}: the artifact keeps its weights apart but the installed torch-neuronx has no "
                        "replace_weights; install torch-neuronx 2.16 or newer from AWS's Neuron package index")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(module, state if state is not None else load_file(str(path)))
        except Exception as e:
            raise UserError(f"{path}: torch_neuronx.replace_weights refused the weights ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}); rebuild the "
                            "artifact") from None
    said = [str(w.message) for w in caught if not issubclass(w.category, DeprecationWarning)]
    if said:
        raise UserError(f"{path}: torch_neuronx.replace_weights did not take the weights ({said[0][:200]}); "
                        "rebuild the artifact")
    return module


__all__ = ["LOADER", "STRUCTURE_KIND", "ExternalNeffHook", "model_state", "replace_into", "separable",
           "structure_document", "unstage"]
