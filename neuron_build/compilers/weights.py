"""Weights apart from the compiled graph: the two parts of the graph key, the weights file, and its checks.

A profile with ``weights = "external"`` (:class:`neuron_build.project.config.Profile`) compiles a
weight-free artifact and ships the weights beside it, so a change of weight values alone (a fine-tune) is
*relinked*, not compiled: the stored artifact's compiled files plus a new weights file
(:mod:`neuron_build.build.graph.relink`).

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
- **Weights once in a serving process**: :class:`SharedWeights` loads each weights file once (known by its
  sha256 or inode) and every package of that content is handed the same tensors
  (``load_constants(..., user_managed=True)``: the package keeps pointers, no copy), each after the
  tensors are checked against its own spec (:func:`state_problem`).
- **The files**: :data:`WEIGHTS_FILE` (safetensors, every weight by FQN) is the weights part;
  :data:`SPEC_FILE` (``{"format", "file", "tensors": {fqn: {"dtype", "shape"}}}``) belongs to the compiled
  part (it is the structure's weights) and is what the weights file is checked against. A spec may name
  several weights files instead (``{"format", "files": {path: {fqn: {"dtype", "shape"}}}}``: NxDI's shards
  ``weights/tp{rank}_sharded_checkpoint.safetensors``, :mod:`neuron_build.compilers.neuron.nxdi_weights`).
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
        return (f"the compiled package inlined {', '.join(sorted(want - have)[:5])} (not in get_constant_fqns(): "
                "a weight tied to another, or a tensor attribute that is no parameter or buffer; untie it or "
                "register it with register_buffer to keep the weights apart)")
    if have - want:
        return f"the compiled package expects constants that are no weight: {', '.join(sorted(have - want)[:5])}"
    return None


def read_specs(folder: str | Path) -> dict[str, dict[str, dict[str, Any]]] | None:
    """Every weights file ``folder``'s :data:`SPEC_FILE` names (a path relative to the folder) -> its
    tensors (``{fqn: {"dtype", "shape"}}``), or None when it has none (an inline artifact). A spec names one
    file (``"file"`` + ``"tensors"``: AOTInductor's :data:`WEIGHTS_FILE`) or several (``"files"``: NxDI's
    ``weights/tp{rank}_sharded_checkpoint.safetensors``, :func:`write_files_spec`).

    Raises:
        ValueError: the file is not a spec of this format, or names a path outside the folder (one line,
            naming it).
    """
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        if raw.get("format") != SPEC_FORMAT:
            raise ValueError("format")
        files = raw["files"] if "files" in raw else {raw["file"]: raw["tensors"]}
        out = {}
        for rel, tensors in files.items():
            if not isinstance(tensors, dict) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ValueError("file")
            out[str(rel)] = {str(k): {"dtype": str(v["dtype"]), "shape": [int(d) for d in v["shape"]]}
                             for k, v in tensors.items()}
        return out
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a weights spec of format {SPEC_FORMAT} ({type(e).__name__}); "
                         "rebuild the artifact") from None


def read_spec(folder: str | Path) -> dict[str, dict[str, Any]] | None:
    """The ``tensors`` of ``folder``'s one-file :data:`SPEC_FILE`, or None when it has none (an inline
    artifact).

    Raises:
        ValueError: the file is not a spec of this format, or names more than one weights file.
    """
    specs = read_specs(folder)
    if specs is None:
        return None
    if len(specs) != 1:
        raise ValueError(f"{Path(folder) / SPEC_FILE} names {len(specs)} weights files, this loader takes one; "
                         "rebuild the artifact")
    return next(iter(specs.values()))


def header_spec(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{fqn: {"dtype", "shape"}}`` of a safetensors file, from its header only (no tensor is read); dtypes
    by their torch names (``float32``, ``bfloat16``). Opened with safetensors' numpy framework: the builder
    checks a relink's weights without importing torch (seconds on a busy host).

    Raises:
        Exception: whatever safetensors raises for a missing or unreadable file.
    """
    from safetensors import safe_open

    back = {v: k for k, v in _ST_DTYPES.items()}
    with safe_open(str(path), framework="numpy") as f:
        return {k: {"dtype": back.get(f.get_slice(k).get_dtype(), f.get_slice(k).get_dtype()),
                    "shape": list(f.get_slice(k).get_shape())} for k in f.keys()}


def write_files_spec(folder: str | Path, files: list[str]) -> None:
    """Write :data:`SPEC_FILE` into ``folder`` naming ``files`` (paths relative to it), each with the names,
    dtypes and shapes its safetensors header holds (:func:`header_spec`)."""
    folder = Path(folder)
    spec = {rel: header_spec(folder / rel) for rel in sorted(files)}
    (folder / SPEC_FILE).write_text(json.dumps({"format": SPEC_FORMAT, "files": spec}, indent=1, sort_keys=True) + "\n")


def problem(folder: str | Path, weights_file: str | Path | None = None, root: str | Path | None = None) -> str | None:
    """Why the weights files do not fit ``folder``'s :data:`SPEC_FILE`, read from their headers only (no
    tensor loaded), or None when they fit (or the folder holds an inline artifact). The files are each one
    the spec names under ``root`` (default ``folder``); ``weights_file`` stands for a one-file spec's file.
    One line naming the file, the tensor and the fix."""
    try:
        specs = read_specs(folder)
    except ValueError as e:
        return str(e)
    for rel, spec in (specs or {}).items():
        path = Path(weights_file) if weights_file is not None else Path(root if root is not None else folder) / rel
        why = _file_problem(path, spec)
        if why is not None:
            return why
    return None


def _file_problem(path: Path, spec: dict[str, dict[str, Any]]) -> str | None:
    fix = "rebuild the artifact or pull the release again"
    try:
        have = {k: (_safetensors_dtype(v["dtype"]), v["shape"]) for k, v in header_spec(path).items()}
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


def state_problem(spec: dict[str, dict[str, Any]], state: dict[str, Any]) -> str | None:
    """Why loaded tensors (FQN -> tensor) do not fit a spec (:func:`read_spec`): a name missing or extra, or
    another dtype or shape; or None. The last check before a package is handed tensors it does not check."""
    missing, extra = sorted(set(spec) - set(state)), sorted(set(state) - set(spec))
    if missing or extra:
        return (f"the weights do not match the compiled graph (missing: {', '.join(missing[:5]) or '-'}; "
                f"unexpected: {', '.join(extra[:5]) or '-'})")
    for k, want in spec.items():
        t = state[k]
        if _dtype(t) != want["dtype"] or [int(d) for d in t.shape] != want["shape"]:
            return (f"weight {k} is {_dtype(t)} {list(t.shape)} but the compiled graph expects "
                    f"{want['dtype']} {want['shape']}")
    return None


def load_checked(folder: str | Path, where: str = "") -> dict[str, Any]:
    """``folder``'s :data:`WEIGHTS_FILE` as FQN -> CPU tensor, after its header is checked against the
    folder's :data:`SPEC_FILE` (:func:`problem`).

    Raises:
        neuron_build.errors.UserError: the file does not fit or cannot be read (one line; nothing loaded).
    """
    from neuron_build.errors import UserError

    why = problem(folder)
    if why is not None:
        raise UserError(f"{where}{why}")
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / WEIGHTS_FILE))


def load_into(module: Any, folder: str | Path, where: str = "", *, state: dict[str, Any] | None = None) -> Any:
    """Load ``folder``'s external weights into an AOTInductor package (``aoti_load_package``'s result), after
    checking the file against the spec and the package's ``get_constant_fqns()``; returns ``module``.

    ``state``: the weights already loaded (:class:`SharedWeights`); the package then uses these very
    tensors (``load_constants(..., user_managed=True)``: no copy, the caller keeps them alive and never
    writes them), after they are checked against this folder's spec. None: the file is read and its
    tensors copied into the package.

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
        if why is None and state is not None:
            why = state_problem(spec, state)
        why = None if why is None else f"{Path(folder) / SPEC_FILE}: {why}; rebuild the artifact"
    if why is not None:
        raise UserError(f"{where}{why}")
    if state is not None:
        module.load_constants(state, check_full_update=True, user_managed=True)
    else:
        module.load_constants(load_checked(folder, where), check_full_update=True)
    return module


class SharedWeights:
    """The weights files of one serving process, each loaded once: every AOTInductor package whose weights
    file has the same content gets the same tensors (:func:`load_into` with ``state``).

    A file is known by its sha256 when ``digests`` (resolved path -> sha256, e.g. a pulled
    ``release.json``'s) lists it, else by ``(st_dev, st_ino)`` (one file, or hard links of one blob).
    ``loaded``: identity -> FQN -> tensor (kept alive here: the packages hold pointers to them).
    """

    def __init__(self, digests: dict[str, str] | None = None):
        self.digests = dict(digests or {})
        self.loaded: dict[Any, dict[str, Any]] = {}

    def get(self, folder: str | Path, where: str = "") -> dict[str, Any]:
        """The tensors of ``folder``'s :data:`WEIGHTS_FILE`, loaded (:func:`load_checked`) on first use.

        Raises:
            neuron_build.errors.UserError: as :func:`load_checked`.
        """
        path = Path(folder) / WEIGHTS_FILE
        ident: Any = self.digests.get(str(path.resolve()))
        if ident is None:
            try:
                st = path.stat()
            except OSError:
                return load_checked(folder, where)  # its one-line error
            ident = (st.st_dev, st.st_ino)
        if ident not in self.loaded:
            self.loaded[ident] = load_checked(folder, where)
        return self.loaded[ident]

    def nbytes(self) -> int:
        """Bytes of the tensors held (each file once)."""
        return sum(t.numel() * t.element_size() for s in self.loaded.values() for t in s.values())


__all__ = ["AOTI_EXTERNAL_CONFIG", "SPEC_FILE", "SPEC_FORMAT", "WEIGHTS_FILE", "SharedWeights", "exported_state",
           "header_spec", "load_checked", "load_into", "problem", "read_spec", "read_specs", "spec_of", "state_problem",
           "structure_document", "uncovered", "weights_document", "write", "write_files_spec"]
