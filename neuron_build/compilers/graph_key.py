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

The key fails closed: it is made only from what it fully read. The ``torch.export`` document descends into
every submodule a node reaches (``get_attr`` of a ``GraphModule``: ``torch.cond`` branches, ``map`` bodies,
``wrap_with_autocast`` / ``wrap_with_set_grad_enabled`` regions, ``while_loop`` / ``scan`` bodies),
recursively, with their constants by value; it keys a ``torch.library`` custom op by its registered Python
implementations (:func:`watch_custom_ops` records those a model registers; ``torch.library.custom_op``
ones are read from torch's own registry) and the output's pytree spec (names and structure). Anything it
cannot read means no graph key, and the target compiles: a call target that is neither one of torch's
operators nor a Python builtin, a higher-order op outside :data:`READ_HIGHER_ORDER_OPS` (a Triton kernel,
a delegate: their bodies live in side tables), a custom op with a kernel registered from C++ or before the
watch, a ``get_attr`` of an opaque object, an argument type without a canonical form. The TorchScript
document keys the attributes a frozen graph still reads (``prim::GetAttr``: buffers ``forward`` updates
in place are not frozen) by value.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from neuron_build.backends import BACKENDS, get_backend
from neuron_build.compilers.graph_document import (  # re-exported: the FX export document and custom ops
    READ_HIGHER_ORDER_OPS,
    TORCH_MANGLE,
    TORCH_OP_NAMESPACES,
    NoGraphKey,
    custom_op_document,
    export_document,
    tensor_digest,
    watch_custom_ops,
)
from neuron_build.errors import NeuronBuildError
from neuron_build.util import canonical_json, sha256_hex, write_json_atomic

#: Bump when a canonical form changes, or when what a backend writes for the same graph changes: every
#: graph key changes with it, so no artifact of the old form is reused.
GRAPH_KEY_FORMAT = 2
#: The file the worker writes into its workdir once it has a graph key (or the reason it has none).
GRAPH_FILE = "graph.json"
#: The builder's answer to a worker that asks whether to compile a graph the listed index did not hold
#: (``{"hit": bool}``, written by :class:`neuron_build.build.graph.gate.GraphGate` once it holds the graph
#: key's lock): asked only when the option's ``gate`` is true.
VERDICT_FILE = "graph-verdict.json"
#: The request option (``CompileRequest.options``) that turns the graph key on: ``{"base": {...}, "known":
#: path of a JSON list of graph keys the index holds}``. Absent: the worker makes no graph key. With
#: ``"probe": true`` (the graph probe, ``python -m neuron_build.worker --graphs``) :func:`checkpoint` raises
#: :class:`GraphHit` with every key it makes, in the index or not, and re-raises :class:`NoGraphKey`: the
#: backend never goes on to compile.
OPTION = "graph_key"
#: Backends whose graph key is made before the compile (a hit compiles nothing): the records of
#: :mod:`neuron_build.backends` with ``graph_key = "before"``.
BEFORE_COMPILE = tuple(b.name for b in BACKENDS.values() if b.graph_key == "before")
#: Backends that cannot make one, and why (logged by the worker): the records with ``graph_key = "none"``.
NO_GRAPH_KEY = {b.name: b.graph_key_why for b in BACKENDS.values() if b.graph_key == "none"}
_HLO_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")


class GraphHit(NeuronBuildError):
    """The graph index holds an artifact of this graph key: the worker stops before compiling.
    ``document`` is the sha256 of the canonical document (:func:`document_digest`), which the builder
    checks against the candidate artifact's manifest before it reuses it."""

    def __init__(self, graph_key: str, document: str | None = None):
        super().__init__(graph_key)
        self.graph_key = graph_key
        self.document = document


# -- TorchScript ----------------------------------------------------------------------------------------

def _ts_type(v: Any) -> str:
    return TORCH_MANGLE.sub("", str(v.type()))


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
        return {"s": TORCH_MANGLE.sub("", n.s(name))}
    if kind == "ss":
        return {"ss": [TORCH_MANGLE.sub("", s) for s in n.ss(name)]}
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


def _ts_custom_op(kind: str) -> dict[str, Any]:
    """:func:`custom_op_document` of the operator a TorchScript node of ``kind`` (``ns::name``) calls."""
    import torch

    ns, _, name = kind.partition("::")
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        overload = getattr(packet, "default" if "default" in packet.overloads() else packet.overloads()[0])
    except (AttributeError, IndexError, RuntimeError) as e:
        raise NoGraphKey(f"node {kind} calls an operator the key cannot find") from e
    return custom_op_document(overload)


def torchscript_document(graph: Any, module: Any = None) -> dict[str, Any]:
    """The canonical document of a TorchScript graph (``frozen.graph``): ``{"kind": "torchscript",
    "inputs": [types], "nodes": [...], "outputs": [value indices]}``; values are numbered in order of
    definition, so debug names (from Python locals) and source ranges never enter. ``module`` is the
    (frozen) module whose graph it is: an attribute the graph still reads (``prim::GetAttr``: a buffer that
    ``forward`` updates in place is not frozen into a constant) enters by value.

    Raises:
        NoGraphKey: an attribute kind (a subgraph, a class object) that has no canonical form, or a
            ``prim::GetAttr`` without ``module`` or of a value the key cannot read.
    """
    import torch

    ids: dict[int, int] = {}
    objects: dict[int, Any] = {}

    def vid(v: Any) -> int:
        u = v.unique()
        if u not in ids:
            ids[u] = len(ids)
        return ids[u]

    inputs = [[vid(v), _ts_type(v)] for v in graph.inputs()]
    if inputs and inputs[0][1].startswith("__torch__."):  # the module itself: its class's import path is
        inputs[0][1] = "module"                           # no part of the frozen graph's computation
        if module is not None:
            objects[next(iter(graph.inputs())).unique()] = module

    def attribute(n: Any) -> Any:
        owner = objects.get(next(iter(n.inputs())).unique())
        name = n.s("name")
        if owner is None or not hasattr(owner, name):
            raise NoGraphKey(f"prim::GetAttr {name} reads an attribute the key cannot resolve")
        value = getattr(owner, name)
        out = next(iter(n.outputs()))
        if isinstance(value, torch.Tensor):
            return {"tensor": tensor_digest(value)}
        if isinstance(value, torch.jit.ScriptModule) or isinstance(value, torch.nn.Module):
            objects[out.unique()] = value
            return {"module": True}
        if isinstance(value, (int, float, bool, str, type(None))):
            return {"value": repr(value)}
        raise NoGraphKey(f"prim::GetAttr {name} reads a {type(value).__name__}, which the key cannot read")

    def walk(block_nodes) -> list:
        out = []
        for n in block_nodes:
            entry = {"kind": n.kind(), "in": [vid(v) for v in n.inputs()],
                     "out": [[vid(v), _ts_type(v)] for v in n.outputs()],
                     "attrs": {a: _ts_attr(n, a) for a in sorted(n.attributeNames())}}
            if n.kind() == "prim::GetAttr":
                entry["value"] = attribute(n)
            elif n.kind().split("::")[0] not in TORCH_OP_NAMESPACES:  # a custom op: by its implementation
                entry["custom_op"] = _ts_custom_op(n.kind())
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
    compiling, by its record's ``graph_capture`` (:mod:`neuron_build.backends`): ``torch.jit.trace`` +
    ``torch.jit.freeze`` (torchscript), ``torch.export`` (inductor, compile-cache). Tests and benchmarks
    compare keys with it.

    Raises:
        NoGraphKey: a backend without a capture outside its compile, or a graph without a canonical form.
        KeyError: no such backend.
    """
    import torch

    capture = get_backend(backend).graph_capture
    with torch.no_grad():
        if capture == "torch.jit.trace":
            frozen = torch.jit.freeze(torch.jit.trace(model, example_inputs, check_trace=False).eval())
            return torchscript_document(frozen.graph, frozen)
        if capture == "torch.export":
            return export_document(torch.export.export(model, example_inputs, strict=False))
    raise NoGraphKey(f"backend {backend} has no graph to capture outside its compile")


# -- the key --------------------------------------------------------------------------------------------

def document_digest(document: dict[str, Any]) -> str:
    """sha256 (64 hex chars) of a canonical document's canonical JSON: recorded in the manifest
    (``graph_document``) beside the graph key, and compared before a reuse."""
    return sha256_hex(canonical_json(document))


def graph_key(document: dict[str, Any], base: dict[str, Any]) -> str:
    """The graph key (64 hex chars): sha256 of the canonical JSON of the format version, the graph's
    canonical ``document`` (:func:`document_digest`) and ``base`` (the source key's components that are
    not the model: ``inputs``, ``compiler``, ``env``, ``toolchain``)."""
    return sha256_hex(canonical_json({"graph_key_format": GRAPH_KEY_FORMAT, "graph": document_digest(document),
                                      **{k: base[k] for k in sorted(base)}}))


def base_of(details: dict[str, Any]) -> dict[str, Any]:
    """The parts of a source key's details (:meth:`neuron_build.project.keys.KeyMaker.details`) a graph key
    takes: everything but the model (the graph stands for it) and the source key's format version."""
    return {k: v for k, v in details.items() if k not in ("model", "format")}


def checkpoint(request: Any, document_of: Any, reuse: bool = True) -> str | None:
    """Called by a backend once it holds the graph it compiles, before compiling it.

    Makes the graph key when the request asks for one (:data:`OPTION`), writes :data:`GRAPH_FILE`
    (``{"graph_key", "document", "seconds"}`` or ``{"graph_key": null, "reason"}``) into the workdir, and raises
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
        GraphHit: the index holds an artifact of this graph key (or the option's ``probe``: any key).
        NoGraphKey: no canonical form, and the option's ``probe`` is set.
    """
    import time

    opts = (request.options or {}).get(OPTION)
    if not opts:
        return None
    out = Path(request.work_dir) / GRAPH_FILE
    t0 = time.monotonic()
    try:
        document = document_of()
        key, digest = graph_key(document, opts["base"]), document_digest(document)
    except NoGraphKey as e:
        if opts.get("probe"):  # the graph probe: no key means the target compiles in its own worker
            raise
        print(f"no graph key: {e}; compiling", flush=True)
        write_json_atomic(out, {"graph_key": None, "reason": str(e)})
        return None
    seconds = round(time.monotonic() - t0, 3)
    if opts.get("probe"):  # the graph probe (neuron_build.build.graph.probe): the key only, never a compile
        raise GraphHit(key, digest)
    known, reuse = opts.get("known"), reuse and not opts.get("no_reuse")
    keys: set = set()
    if reuse and known:
        try:
            keys = set(json.loads(Path(known).read_text()))
        except (OSError, ValueError):
            keys = set()
    asks = bool(reuse and opts.get("gate") and key not in keys)
    write_json_atomic(out, {"graph_key": key, "document": digest, "seconds": seconds, "asks": asks})
    print(f"graph key {key[:12]} ({seconds:.2f} s)", flush=True)
    if reuse and key in keys:
        print(f"graph key {key[:12]} is in the graph index: not compiling", flush=True)
        raise GraphHit(key, digest)
    if asks and _verdict(Path(request.work_dir) / VERDICT_FILE, key):
        print(f"graph key {key[:12]} was compiled by another builder meanwhile: not compiling", flush=True)
        raise GraphHit(key, digest)
    return key


def _verdict(path: Path, key: str) -> bool:
    """Wait for the builder's answer (:data:`VERDICT_FILE`): True to reuse, False to compile. The builder
    answers once it holds the graph key's lock (another builder may be compiling the same graph)."""
    import time

    print(f"graph key {key[:12]}: waiting for its compile lock", flush=True)
    while True:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        return isinstance(raw, dict) and raw.get("hit") is True


__all__ = ["BEFORE_COMPILE", "capture_document", "GRAPH_FILE", "GRAPH_KEY_FORMAT", "NO_GRAPH_KEY", "OPTION", "VERDICT_FILE", "GraphHit", "NoGraphKey",
           "READ_HIGHER_ORDER_OPS", "TORCH_OP_NAMESPACES", "base_of", "checkpoint", "custom_op_document",
           "document_digest", "export_document", "graph_key", "hlo_document", "tensor_digest", "torchscript_document",
           "watch_custom_ops"]
