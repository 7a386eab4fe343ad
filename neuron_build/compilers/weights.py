"""Weights apart from the compiled graph: the two parts of the graph key, the weights file, and its checks.

A profile with ``weights = "external"`` (:class:`neuron_build.project.config.Profile`) compiles a
weight-free artifact and ships the weights beside it, so a change of weight values alone (a fine-tune) is
*relinked*, not compiled: the stored artifact's compiled files plus a new weights file
(:mod:`neuron_build.build.relink`).

- **Two parts of the graph key** (``torch.export`` programs: inductor). :func:`structure_document` is the
  canonical graph document (:func:`neuron_build.compilers.graph_document.export_document`) with the
  weights by name, dtype and shape and how they are bound (placeholder kind and FQN), never by value: the
  graph key of an external-weights target is made from it. :func:`weights_document` holds the weights by
  content (:func:`~neuron_build.compilers.graph_document.tensor_digest`). A weight whose shape or dtype
  changes changes the structure: it compiles.
- **AOTInductor with external constants** [ran, torch 2.13: shared/weights-and-real-hlo.md 3.4]:
  :data:`AOTI_EXTERNAL_CONFIG` makes the ``.so`` byte-identical across weight values. Without
  ``always_keep_tensor_constants`` a 1-D tensor of <= 8 elements or a 0-d tensor is inlined into the
  kernels as literals (a swap then serves wrong numbers), so the compile checks that
  ``get_constant_fqns()`` lists every weight (:func:`uncovered`); it does not check anything, it segfaults
  when called before its constants are loaded, and a wrong-shape tensor corrupts the heap: the loader
  (:func:`load_into`) checks names, shapes and dtypes against :data:`SPEC_FILE` **before** any load.
- **The files**: :data:`WEIGHTS_FILE` (safetensors, every weight by FQN) is the weights part;
  :data:`SPEC_FILE` (``{"format", "file", "tensors": {fqn: {"dtype", "shape"}}}``) belongs to the compiled
  part (it is the structure's weights) and is what the weights file is checked against.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuron_build.compilers.graph_document import NoGraphKey, export_document, tensor_digest

#: The weights file of an external-weights artifact (safetensors, every weight by its FQN).
WEIGHTS_FILE = "weights.safetensors"
#: The names, dtypes and shapes the compiled part expects (part of the compiled part, not of the weights).
SPEC_FILE = "weights.json"
SPEC_FORMAT = 1
#: ``inductor_configs`` of an external-weights AOTInductor compile (both needed: see the module docstring).
AOTI_EXTERNAL_CONFIG = {"aot_inductor.package_constants_in_so": False, "always_keep_tensor_constants": True}


def exported_state(ep: Any) -> dict[str, Any]:
    """FQN -> tensor of every parameter, buffer and constant tensor a ``torch.export`` program binds, in
    graph-input order.

    Raises:
        NoGraphKey: a bound value the program does not hold.
    """
    from torch.export.graph_signature import InputKind

    out: dict[str, Any] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        value = ep.state_dict.get(spec.target) if spec.kind != InputKind.CONSTANT_TENSOR else None
        if value is None:
            value = ep.constants.get(spec.target)
        if value is None or not hasattr(value, "detach"):
            raise NoGraphKey(f"the value of {spec.target} is not a tensor of the exported program")
        out[str(spec.target)] = value
    return out


def _dtype(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def spec_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """FQN -> ``{"dtype", "shape"}`` of each weight (what the compiled part expects)."""
    return {k: {"dtype": _dtype(t), "shape": [int(d) for d in t.shape]} for k, t in state.items()}


def structure_document(ep: Any, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The structure part of the graph key of a ``torch.export`` program: :func:`export_document` with
    ``weights`` as ``[fqn, dtype, shape]`` in graph-input order (names, dtypes and shapes, no values).

    Raises:
        NoGraphKey: as :func:`export_document`.
    """
    state = exported_state(ep) if state is None else state
    doc = export_document(ep)
    spec = spec_of(state)
    doc["kind"] = "export-structure"
    doc["weights"] = [[k, spec[k]["dtype"], spec[k]["shape"]] for k in state]
    return doc


def weights_document(state: dict[str, Any]) -> dict[str, str]:
    """The weights part: FQN -> :func:`tensor_digest` (dtype, shape and bytes)."""
    return {k: tensor_digest(t) for k, t in state.items()}


def write(folder: str | Path, state: dict[str, Any]) -> None:
    """Write :data:`WEIGHTS_FILE` and :data:`SPEC_FILE` of ``state`` into ``folder`` (made if missing: the
    graph probe's and ``verify --fresh``'s output folder is never made, and a failed write keys the graph
    by value, which differs from the recorded structure key)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: t.detach().to("cpu").contiguous().clone() for k, t in state.items()}, str(folder / WEIGHTS_FILE))
    (folder / SPEC_FILE).write_text(json.dumps({"format": SPEC_FORMAT, "file": WEIGHTS_FILE,
                                                "tensors": spec_of(state)}, indent=1, sort_keys=True) + "\n")


def uncovered(constant_fqns: list[str], state: dict[str, Any]) -> str | None:
    """Why a compiled package cannot take its weights from outside (a weight it does not list: inlined into
    its kernels; or a constant it lists that is not a weight), or None."""
    have, want = set(constant_fqns), set(state)
    if want - have:
        return f"the compiled package inlined {', '.join(sorted(want - have)[:5])} (not in get_constant_fqns())"
    if have - want:
        return f"the compiled package expects constants that are no weight: {', '.join(sorted(have - want)[:5])}"
    return None


def read_spec(folder: str | Path) -> dict[str, dict[str, Any]] | None:
    """The ``tensors`` of ``folder``'s :data:`SPEC_FILE`, or None when it has none (an inline artifact).

    Raises:
        ValueError: the file is not a spec of this format (one line, naming it).
    """
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        tensors = raw["tensors"]
        if raw.get("format") != SPEC_FORMAT or not isinstance(tensors, dict):
            raise ValueError("format")
        return {str(k): {"dtype": str(v["dtype"]), "shape": [int(d) for d in v["shape"]]} for k, v in tensors.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a weights spec of format {SPEC_FORMAT} ({type(e).__name__}); "
                         "rebuild the artifact") from None


def problem(folder: str | Path, weights_file: str | Path | None = None) -> str | None:
    """Why ``weights_file`` (default: ``folder``/:data:`WEIGHTS_FILE`) does not fit ``folder``'s
    :data:`SPEC_FILE`, read from its header only (no tensor loaded), or None when it fits (or the folder
    holds an inline artifact). One line naming the file, the tensor and the fix."""
    try:
        spec = read_spec(folder)
    except ValueError as e:
        return str(e)
    if spec is None:
        return None
    path = Path(weights_file) if weights_file is not None else Path(folder) / WEIGHTS_FILE
    fix = "rebuild the artifact or pull the release again"
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            have = {k: (f.get_slice(k).get_dtype(), list(f.get_slice(k).get_shape())) for k in f.keys()}
    except Exception as e:  # missing, truncated, not safetensors: one line, never a crash
        return f"{path}: the weights file cannot be read ({type(e).__name__}: {str(e)[:120]}); {fix}"
    missing, extra = sorted(set(spec) - set(have)), sorted(set(have) - set(spec))
    if missing or extra:
        return (f"{path}: the weights do not match the compiled graph (missing: {', '.join(missing[:5]) or '-'}; "
                f"unexpected: {', '.join(extra[:5]) or '-'}); {fix}")
    for k, want in spec.items():
        dtype, shape = have[k]
        if shape != want["shape"] or _safetensors_dtype(want["dtype"]) != dtype:
            return (f"{path}: weight {k} is {dtype} {shape} but the compiled graph expects "
                    f"{_safetensors_dtype(want['dtype'])} {want['shape']}; {fix}")
    return None


_ST_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
              "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
              "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def _safetensors_dtype(torch_dtype: str) -> str:
    return _ST_DTYPES.get(torch_dtype, torch_dtype)


def load_into(module: Any, folder: str | Path, where: str = "") -> Any:
    """Load ``folder``'s external weights into an AOTInductor package (``aoti_load_package``'s result), after
    checking the file against the spec and the package's ``get_constant_fqns()``; returns ``module``.

    Raises:
        neuron_build.errors.UserError: a weights file that does not fit (nothing loaded: the package is
            never called without its constants, and no tensor of a wrong shape reaches it).
    """
    from neuron_build.errors import UserError

    why = problem(folder)
    if why is None:
        spec = read_spec(folder) or {}
        try:
            why = uncovered(list(module.get_constant_fqns()), dict.fromkeys(spec))
        except (AttributeError, RuntimeError) as e:
            why = f"the package cannot list its constants ({type(e).__name__})"
        why = None if why is None else f"{Path(folder) / SPEC_FILE}: {why}; rebuild the artifact"
    if why is not None:
        raise UserError(f"{where}{why}")
    from safetensors.torch import load_file

    module.load_constants(load_file(str(Path(folder) / WEIGHTS_FILE)), check_full_update=True)
    return module


__all__ = ["AOTI_EXTERNAL_CONFIG", "SPEC_FILE", "SPEC_FORMAT", "WEIGHTS_FILE", "exported_state", "load_into",
           "problem", "read_spec", "spec_of", "structure_document", "uncovered", "weights_document", "write"]
