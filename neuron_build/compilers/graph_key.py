"""The graph key: the second level of the key, a digest of the graph a backend is about to compile.

The source key (:mod:`neuron_build.project.keys`) is a digest of the sources; it misses on a comment, a
docstring or a renamed local. On such a miss the backend captures its graph (seconds), and this module
turns the graph into a canonical document with every cosmetic fact removed (source locations, stack
traces, file paths, debug names and generated node names), digests it with the weights by content and
the source key's other components (input shapes and dtypes, backend, hardware target, compiler args,
environment, toolchain versions), and asks whether the store's graph index
(:mod:`neuron_build.store.graph_index`) holds an artifact compiled from the same graph. ccache's
preprocessor mode is the model: key on what the compiler really sees.

Per backend (the canonical forms; measured in the shared notes, "which graph hashes survive cosmetic
edits"):

- ``inductor`` and ``compile-cache``: the ``torch.export`` program. Each node as its op, its target,
  its arguments with node references by index, and the shape and dtype of its value; placeholders as
  their input kind plus the parameter or buffer FQN (not the user input's name); weights and constants
  by value in graph-input order. ``stack_trace``, ``nn_module_stack`` and node names are left out.
- ``torchscript``: the frozen graph (``torch.jit.freeze`` of the trace): each node's kind, its inputs by
  index, its outputs' types and its attributes (tensor constants, the frozen weights, by content).
  Source ranges, scopes and debug names (``%x.1``, from Python locals) are left out; the mangling
  counter of class names (``___torch_mangle_N``) too.
- ``neuron``: the HLO module ``torch_neuronx.trace`` writes for neuronx-cc (``model/graph.hlo``), with
  metadata (``metadata={...}``: op names and source file and line) and comments removed, and the weight
  files it references by content. The module exists only inside ``torch_neuronx.trace``, which also runs
  neuronx-cc, so this key is recorded (manifest, index) after the compile and never skips one.
- ``torchneuron``: no stable graph key (the graph goes to the backend inside ``torch.compile``): the
  worker says so and compiles, as before.

When anything in a graph is not understood (a custom object, an unknown argument type), no graph key is
made and the target compiles: when in doubt, compile.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from neuron_build.util import canonical_json, sha256_hex, write_json_atomic

#: Bump when a canonical form changes, or when what a backend writes for the same graph changes: every
#: graph key changes with it, so no artifact of the old form is reused.
GRAPH_KEY_FORMAT = 1
#: The file the worker writes into its workdir once it has a graph key (or the reason it has none).
GRAPH_FILE = "graph.json"
#: The request option (``CompileRequest.options``) that turns the graph key on: ``{"base": {...}, "known":
#: path of a JSON list of graph keys the index holds}``. Absent: the worker makes no graph key.
OPTION = "graph_key"
#: Backends whose graph key is made before the compile (a hit compiles nothing).
BEFORE_COMPILE = ("inductor", "compile-cache", "torchscript")
#: Backends that cannot make one, and why (logged by the worker).
NO_GRAPH_KEY = {
    "torchneuron": "torch.compile(backend='neuron') hands its graph to the backend inside Dynamo; "
                   "there is no graph to key on before the compile",
}
_MANGLE = re.compile(r"___torch_mangle_\d+\.")
_HLO_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")


class NoGraphKey(Exception):
    """The graph holds something the canonical form does not understand; the reason is one line."""


class GraphHit(Exception):
    """The graph index holds an artifact of this graph key: the worker stops before compiling."""

    def __init__(self, graph_key: str):
        super().__init__(graph_key)
        self.graph_key = graph_key


def tensor_digest(t: Any) -> str:
    """sha256 of a tensor's dtype, shape and bytes (C-contiguous, on the CPU): its value, not its storage."""
    import torch

    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{list(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- torch.export ---------------------------------------------------------------------------------------

def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    name = getattr(target, "name", None)
    if callable(name):  # OpOverload / OpOverloadPacket: "aten::linear" with overload
        try:
            return str(target)
        except Exception:  # pragma: no cover
            pass
    mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if mod and qual and "<" not in qual:
        return f"{mod}.{qual}"
    raise NoGraphKey(f"a node calls {target!r}, which has no stable name")


def _meta_val(v: Any) -> Any:
    import torch

    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return {"shape": [str(d) for d in v.shape], "dtype": str(v.dtype)}
    if isinstance(v, (list, tuple)):
        return [_meta_val(x) for x in v]
    if isinstance(v, (int, float, bool, str, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(v)
    return type(v).__name__


def _fx_arg(a: Any, index: dict) -> Any:
    import torch
    import torch.fx

    if isinstance(a, torch.fx.Node):
        return {"node": index[a]}
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if isinstance(a, float):
        return {"float": repr(a)}
    if isinstance(a, (list, tuple)):
        return {type(a).__name__: [_fx_arg(x, index) for x in a]}
    if isinstance(a, dict):
        return {"dict": [[str(k), _fx_arg(v, index)] for k, v in sorted(a.items(), key=lambda kv: str(kv[0]))]}
    if isinstance(a, slice):
        return {"slice": [_fx_arg(a.start, index), _fx_arg(a.stop, index), _fx_arg(a.step, index)]}
    if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return {type(a).__name__: str(a)}
    if isinstance(a, torch.Tensor):
        return {"tensor": tensor_digest(a)}
    raise NoGraphKey(f"a node argument of type {type(a).__name__} has no canonical form")


def export_document(ep: Any) -> dict[str, Any]:
    """The canonical document of a ``torch.export.ExportedProgram``: ``{"kind": "export", "graph": [...],
    "inputs": [...], "weights": [...]}``.

    ``graph`` holds one entry per node (op, target, arguments with node references by index, the shape and
    dtype of its value); ``inputs`` the placeholders' kinds and, for parameters, buffers and constants,
    their FQNs; ``weights`` the :func:`tensor_digest` of each parameter, buffer and constant in graph-input
    order.

    Raises:
        NoGraphKey: a custom object input, or a node whose target or argument has no canonical form.
    """
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if getattr(s.arg, "name", None) is not None}
    index: dict[Any, int] = {}
    nodes, inputs, weights = [], [], []
    for i, n in enumerate(ep.graph.nodes):
        index[n] = i
        entry: dict[str, Any] = {"op": n.op}
        if n.op == "placeholder":
            spec = specs.get(n.target)
            if spec is None:
                raise NoGraphKey(f"placeholder {n.target} is not in the graph signature")
            kind = spec.kind
            if kind == InputKind.USER_INPUT:
                inputs.append({"kind": "user_input"})
            elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                value = ep.state_dict.get(spec.target) if kind != InputKind.CONSTANT_TENSOR else None
                if value is None:
                    value = ep.constants.get(spec.target)
                if value is None:
                    raise NoGraphKey(f"the value of {spec.target} is not in the exported program")
                inputs.append({"kind": kind.name.lower(), "fqn": spec.target,
                               "persistent": getattr(spec, "persistent", None)})
                weights.append(tensor_digest(value))
            else:
                raise NoGraphKey(f"graph input {spec.target} of kind {kind.name} has no canonical form")
        else:
            entry["target"] = _target_name(n.target)
            entry["args"] = _fx_arg(tuple(n.args), index)
            entry["kwargs"] = _fx_arg(dict(n.kwargs), index)
        entry["val"] = _meta_val(n.meta.get("val"))
        nodes.append(entry)
    outputs = [{"kind": s.kind.name.lower(), "target": s.target if s.kind.name != "USER_OUTPUT" else None}
               for s in sig.output_specs]
    return {"kind": "export", "graph": nodes, "inputs": inputs, "outputs": outputs, "weights": weights}


# -- TorchScript ----------------------------------------------------------------------------------------

def _ts_type(v: Any) -> str:
    return _MANGLE.sub("", str(v.type()))


def _ts_attr(n: Any, name: str) -> Any:
    kind = n.kindOf(name)
    if kind == "t":
        return {"t": tensor_digest(n.t(name))}
    if kind == "ts":
        return {"ts": [tensor_digest(t) for t in n.ts(name)]}
    if kind == "f":
        return {"f": repr(n.f(name))}
    if kind == "fs":
        return {"fs": [repr(x) for x in n.fs(name)]}
    if kind == "i":
        return {"i": n.i(name)}
    if kind == "is":
        return {"is": list(n.is_(name))}
    if kind == "s":
        return {"s": _MANGLE.sub("", n.s(name))}
    if kind == "ss":
        return {"ss": [_MANGLE.sub("", s) for s in n.ss(name)]}
    if kind == "ival":
        import torch

        v = n.ival(name)
        if isinstance(v, torch.Tensor):
            return {"ival": tensor_digest(v)}
        if isinstance(v, (int, float, bool, str, type(None))):
            return {"ival": repr(v)}
        if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, bool, str)) for x in v):
            return {"ival": repr(v)}
        raise NoGraphKey(f"constant {name} of {n.kind()} is a {type(v).__name__}")
    raise NoGraphKey(f"attribute {name} of {n.kind()} has kind {kind}, which has no canonical form")


def torchscript_document(graph: Any) -> dict[str, Any]:
    """The canonical document of a TorchScript graph (``frozen.graph``): ``{"kind": "torchscript",
    "inputs": [types], "nodes": [...], "outputs": [value indices]}``; values are numbered in order of
    definition, so debug names (from Python locals) and source ranges never enter.

    Raises:
        NoGraphKey: an attribute kind (a subgraph, a class object) that has no canonical form.
    """
    ids: dict[int, int] = {}

    def vid(v: Any) -> int:
        u = v.unique()
        if u not in ids:
            ids[u] = len(ids)
        return ids[u]

    inputs = [[vid(v), _ts_type(v)] for v in graph.inputs()]
    if inputs and inputs[0][1].startswith("__torch__."):  # the module itself: its class's import path is
        inputs[0][1] = "module"                           # no part of the frozen graph's computation

    def walk(block_nodes) -> list:
        out = []
        for n in block_nodes:
            entry = {"kind": n.kind(), "in": [vid(v) for v in n.inputs()],
                     "out": [[vid(v), _ts_type(v)] for v in n.outputs()],
                     "attrs": {a: _ts_attr(n, a) for a in sorted(n.attributeNames())}}
            blocks = list(n.blocks())
            if blocks:
                entry["blocks"] = [{"in": [vid(v) for v in b.inputs()], "nodes": walk(b.nodes()),
                                    "out": [vid(v) for v in b.outputs()]} for b in blocks]
            out.append(entry)
        return out

    nodes = walk(graph.nodes())
    return {"kind": "torchscript", "inputs": inputs, "nodes": nodes, "outputs": [vid(v) for v in graph.outputs()]}


# -- the HLO module of the XLA trace path ---------------------------------------------------------------

def hlo_document(model_dir: str | Path) -> dict[str, Any]:
    """The canonical document of the HLO module ``torch_neuronx.trace`` wrote for neuronx-cc: its text with
    ``metadata={...}`` (op names, source file and line) and ``#`` comment lines removed, and the sha256 of
    every weight file ``metadata.json`` names (by its key, in sorted order). A binary ``HloModuleProto``
    is keyed by its bytes (metadata included: sensitive to source lines, so cosmetic edits may miss, but
    never wrong).

    Raises:
        NoGraphKey: there is no ``graph.hlo`` (or the file ``metadata.json`` names) in ``model_dir``.
    """
    model_dir = Path(model_dir)
    meta: dict[str, Any] = {}
    try:
        meta = json.loads((model_dir / "metadata.json").read_text())
    except (OSError, ValueError):
        meta = {}
    hlo = model_dir / str(meta.get("model_files") or "graph.hlo")
    try:
        data = hlo.read_bytes()
    except OSError as e:
        raise NoGraphKey(f"no HLO module at {hlo.name} in the trace workdir ({e.strerror or e})") from e
    try:
        text = data.decode("utf-8")
        lines = [_HLO_METADATA.sub("", ln).rstrip() for ln in text.splitlines()]
        module = {"text": sha256_hex("\n".join(ln for ln in lines if ln and not ln.lstrip().startswith("#"))
                                     .encode())}
    except UnicodeDecodeError:
        module = {"proto": hashlib.sha256(data).hexdigest()}
    weights = {}
    for k, rel in sorted((meta.get("weights") or {}).items(), key=lambda kv: str(kv[0])):
        f = model_dir / str(rel)
        if ".." in Path(str(rel)).parts or not f.is_file():
            raise NoGraphKey(f"weight {k} of the HLO module ({rel}) is not a file under the trace workdir")
        weights[str(k)] = hashlib.sha256(f.read_bytes()).hexdigest()
    return {"kind": "hlo", "module": module, "weights": weights}


def capture_document(backend: str, model: Any, example_inputs: tuple) -> dict[str, Any]:
    """The canonical document of ``model`` on ``example_inputs`` as ``backend`` captures it, without
    compiling: ``torch.jit.trace`` + ``torch.jit.freeze`` for ``torchscript``, ``torch.export`` for
    ``inductor`` and ``compile-cache`` (tests and benchmarks compare keys with it).

    Raises:
        NoGraphKey: another backend, or a graph without a canonical form.
    """
    import torch

    with torch.no_grad():
        if backend == "torchscript":
            frozen = torch.jit.freeze(torch.jit.trace(model, example_inputs, check_trace=False).eval())
            return torchscript_document(frozen.graph)
        if backend in ("inductor", "compile-cache"):
            return export_document(torch.export.export(model, example_inputs, strict=False))
    raise NoGraphKey(f"backend {backend} has no graph to capture outside its compile")


# -- the key --------------------------------------------------------------------------------------------

def graph_key(document: dict[str, Any], base: dict[str, Any]) -> str:
    """The graph key (64 hex chars): sha256 of the canonical JSON of the format version, the graph's
    canonical ``document`` and ``base`` (the source key's components that are not the model: ``inputs``,
    ``compiler``, ``env``, ``toolchain``)."""
    return sha256_hex(canonical_json({"graph_key_format": GRAPH_KEY_FORMAT, "graph": sha256_hex(
        canonical_json(document)), **{k: base[k] for k in sorted(base)}}))


def base_of(details: dict[str, Any]) -> dict[str, Any]:
    """The parts of a source key's details (:meth:`neuron_build.project.keys.KeyMaker.details`) a graph key
    takes: everything but the model (the graph stands for it) and the source key's format version."""
    return {k: v for k, v in details.items() if k not in ("model", "format")}


def checkpoint(request: Any, document_of: Any, reuse: bool = True) -> str | None:
    """Called by a backend once it holds the graph it compiles, before compiling it.

    Makes the graph key when the request asks for one (:data:`OPTION`), writes :data:`GRAPH_FILE`
    (``{"graph_key", "seconds"}`` or ``{"graph_key": null, "reason"}``) into the workdir, and raises
    :class:`GraphHit` when the graph index (its key list, written by the builder) holds the key.

    Args:
        request: the :class:`~neuron_build.compilers.base.CompileRequest`.
        document_of: a callable returning the canonical document (one of the ``*_document`` functions
            applied to the graph); a :class:`NoGraphKey` it raises means "compile".
        reuse: False where the graph is only seen after the compile (the XLA trace path: the HLO module
            exists inside ``torch_neuronx.trace``): the key is recorded for the index, never a hit.

    Returns:
        The graph key, or None (not asked for, or the graph has no canonical form).

    Raises:
        GraphHit: the index holds an artifact of this graph key.
    """
    import time

    opts = (request.options or {}).get(OPTION)
    if not opts:
        return None
    out = Path(request.work_dir) / GRAPH_FILE
    t0 = time.monotonic()
    try:
        key = graph_key(document_of(), opts["base"])
    except NoGraphKey as e:
        print(f"no graph key: {e}; compiling", flush=True)
        write_json_atomic(out, {"graph_key": None, "reason": str(e)})
        return None
    seconds = round(time.monotonic() - t0, 3)
    write_json_atomic(out, {"graph_key": key, "seconds": seconds})
    print(f"graph key {key[:12]} ({seconds:.2f} s)", flush=True)
    known = opts.get("known")
    if reuse and known and not opts.get("no_reuse"):
        try:
            keys = set(json.loads(Path(known).read_text()))
        except (OSError, ValueError):
            keys = set()
        if key in keys:
            print(f"graph key {key[:12]} is in the graph index: not compiling", flush=True)
            raise GraphHit(key)
    return key


__all__ = ["BEFORE_COMPILE", "capture_document", "GRAPH_FILE", "GRAPH_KEY_FORMAT", "NO_GRAPH_KEY", "OPTION", "GraphHit", "NoGraphKey",
           "base_of", "checkpoint", "export_document", "graph_key", "hlo_document", "tensor_digest",
           "torchscript_document"]
