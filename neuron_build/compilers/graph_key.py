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

import ast
import hashlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

from neuron_build.backends import BACKENDS, get_backend
from neuron_build.util import canonical_json, sha256_hex, write_json_atomic

#: Bump when a canonical form changes, or when what a backend writes for the same graph changes: every
#: graph key changes with it, so no artifact of the old form is reused.
GRAPH_KEY_FORMAT = 2
#: The file the worker writes into its workdir once it has a graph key (or the reason it has none).
GRAPH_FILE = "graph.json"
#: The builder's answer to a worker that asks whether to compile a graph the listed index did not hold
#: (``{"hit": bool}``, written by :class:`neuron_build.build.graph_gate.GraphGate` once it holds the graph
#: key's lock): asked only when the option's ``gate`` is true.
VERDICT_FILE = "graph-verdict.json"
#: The request option (``CompileRequest.options``) that turns the graph key on: ``{"base": {...}, "known":
#: path of a JSON list of graph keys the index holds}``. Absent: the worker makes no graph key.
OPTION = "graph_key"
#: Backends whose graph key is made before the compile (a hit compiles nothing): the records of
#: :mod:`neuron_build.backends` with ``graph_key = "before"``.
BEFORE_COMPILE = tuple(b.name for b in BACKENDS.values() if b.graph_key == "before")
#: Backends that cannot make one, and why (logged by the worker): the records with ``graph_key = "none"``.
NO_GRAPH_KEY = {b.name: b.graph_key_why for b in BACKENDS.values() if b.graph_key == "none"}
#: Higher-order ops whose meaning is their name and their arguments (bodies are ``get_attr``'d graph modules,
#: read recursively); any other higher-order op (Triton kernels and delegates keep their bodies in side
#: tables) means no graph key. Their semantics are torch's: the torch version is in the key.
READ_HIGHER_ORDER_OPS = frozenset({
    "cond", "map_impl", "while_loop", "scan", "associative_scan", "wrap", "wrap_with_autocast",
    "wrap_with_set_grad_enabled", "auto_functionalized", "auto_functionalized_v2", "invoke_subgraph", "out_dtype",
    "hints_wrapper", "tag_activation_checkpoint", "flex_attention"})
#: Operator namespaces whose kernels are torch's own (C++ or torch's Python): keyed by name (the torch
#: version is in the key). An operator of any other namespace is a custom op: keyed by its implementation.
TORCH_OP_NAMESPACES = frozenset({
    "aten", "prims", "prim", "quantized", "_quantized", "quantized_decomposed", "_c10d_functional",
    "c10d_functional", "_c10d_functional_autograd", "onednn", "mkldnn", "mkl", "inductor", "_inductor"})
#: Modules of callables keyed by their name (torch's own code, versioned in the key, and the standard library).
_TRUSTED_MODULE_ROOTS = frozenset({"torch", "builtins", "_operator", "operator", "math", "_functools", "functools"})
_MANGLE = re.compile(r"___torch_mangle_\d+\.")
_HLO_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")


class NoGraphKey(Exception):
    """The graph holds something the canonical form does not understand; the reason is one line."""


class GraphHit(Exception):
    """The graph index holds an artifact of this graph key: the worker stops before compiling.
    ``document`` is the sha256 of the canonical document (:func:`document_digest`), which the builder
    checks against the candidate artifact's manifest before it reuses it."""

    def __init__(self, graph_key: str, document: str | None = None):
        super().__init__(graph_key)
        self.graph_key = graph_key
        self.document = document


def tensor_digest(t: Any) -> str:
    """sha256 of a tensor's dtype, shape and bytes (C-contiguous, on the CPU): its value, not its storage."""
    import torch

    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}|{list(t.shape)}|".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- custom ops: keyed by their implementation -------------------------------------------------------

#: ``"ns::name[.overload]"`` -> {dispatch key: the Python kernel}, for every ``Library.impl`` made since
#: :func:`watch_custom_ops` (the worker calls it before the model is built).
_WATCHED: dict[str, dict[str, Any]] | None = None


def watch_custom_ops() -> None:
    """Record every Python kernel registered through ``torch.library`` from now on (``Library.impl``, which
    ``torch.library.impl`` and ``custom_op`` use), so that a custom op in a graph can be keyed by its
    implementation. Idempotent. A custom op whose kernels were registered before the call, or from C++,
    has no implementation to key: the graph gets no graph key."""
    global _WATCHED
    if _WATCHED is not None:
        return
    import torch.library

    _WATCHED = {}
    original = torch.library.Library.impl

    def impl(self, op_name, fn, dispatch_key="", *args, **kwargs):
        out = original(self, op_name, fn, dispatch_key, *args, **kwargs)
        name = self._resolve_op_name(op_name, "impl")
        qual = name if "::" in name else f"{self.ns}::{name}"
        _WATCHED.setdefault(qual, {})[dispatch_key or self.dispatch_key or "CompositeImplicitAutograd"] = fn
        return out

    impl.__doc__ = original.__doc__
    torch.library.Library.impl = impl


def _trusted_module(name: str | None) -> bool:
    root = (name or "").split(".")[0]
    return root in _TRUSTED_MODULE_ROOTS or root in sys.stdlib_module_names


def _module_digest(module: Any) -> str:
    """sha256 of a module's source as a syntax tree (comments and line numbers do not enter)."""
    try:
        src = inspect.getsource(module)
    except (OSError, TypeError) as e:
        raise NoGraphKey(f"the source of module {getattr(module, '__name__', module)} cannot be read") from e
    return sha256_hex(ast.dump(ast.parse(src)).encode())


def _code_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


def _callable_document(fn: Any, seen: dict[str, str]) -> None:
    """Add to ``seen`` (module name -> digest) the source of ``fn``'s module and, transitively, of every
    module whose functions, classes or self it references; torch's and the standard library's by name."""
    import torch

    fn = inspect.unwrap(fn)
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__
    mod_name = getattr(fn, "__module__", None) if not inspect.ismodule(fn) else fn.__name__
    if _trusted_module(mod_name):
        return
    module = fn if inspect.ismodule(fn) else sys.modules.get(mod_name or "")
    if module is None:
        raise NoGraphKey(f"{fn!r} has no module whose source can be read")
    if mod_name in seen:
        return
    seen[mod_name] = _module_digest(module)
    values = []
    if inspect.isfunction(fn):
        values = [fn.__globals__.get(n) for n in sorted(_code_names(fn.__code__))]
        for cell in fn.__closure__ or ():
            try:
                values.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    elif not (inspect.ismodule(fn) or inspect.isclass(fn)):
        raise NoGraphKey(f"the implementation {type(fn).__name__} is not a Python function")
    for v in values:
        if isinstance(v, torch.Tensor):
            seen[f"{mod_name}:tensor:{len(seen)}"] = tensor_digest(v)
        elif inspect.isfunction(v) or inspect.ismodule(v) or inspect.isclass(v):
            _callable_document(v, seen)


def _kernel_keys(qualname: str) -> list[tuple[str, str]]:
    """(dispatch key, where it was registered) of every kernel the dispatcher holds for ``qualname``."""
    import torch

    out = []
    for line in torch._C._dispatch_dump(qualname).splitlines():
        m = re.match(r"^(\w+)(?:\[alias\])?(?: \(inactive\))?: registered at (.*?)(?: :: |$)", line)
        if m and not line.startswith(("name:", "schema:", "debug:", "alias analysis")):
            out.append((m.group(1), m.group(2)))
    return out


def custom_op_document(op: Any) -> dict[str, Any]:
    """The implementation of a custom operator (an ``OpOverload`` outside :data:`TORCH_OP_NAMESPACES`, or an
    operator of torch given a Python kernel by the model): the source digests of the modules of its Python
    kernels (``torch.library.custom_op``'s functions, and every ``Library.impl`` recorded by
    :func:`watch_custom_ops`), per dispatch key. A kernel's module is read whole (as a syntax tree), with the
    modules of the functions it references, transitively; a class or module it references is read whole
    but not followed further, and torch's and the standard library's code by name.

    Raises:
        NoGraphKey: a kernel of the op was registered from C++ or before the watch, or a kernel's source
            cannot be read.
    """
    import torch

    schema = op._schema
    qual = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    watched = {**(_WATCHED or {}).get(schema.name, {}), **(_WATCHED or {}).get(qual, {})}
    from torch._library.custom_ops import OPDEFS

    defn = OPDEFS.get(schema.name)
    fns: dict[str, Any] = dict(watched)
    if defn is not None:
        for attr in ("_init_fn", "_abstract_fn", "_setup_context_fn", "_backward_fn", "_vmap_fn"):
            if getattr(defn, attr, None) is not None:
                fns[attr] = getattr(defn, attr)
        for device, f in sorted((getattr(defn, "_backend_fns", None) or {}).items(), key=lambda kv: str(kv[0])):
            fns[f"backend:{device}"] = f
    torch_dir = str(Path(torch.__file__).parent)
    for key, where in _kernel_keys(schema.name):
        if key in watched or (defn is not None and where.startswith(torch_dir)):
            continue
        raise NoGraphKey(f"custom op {qual} has a {key} kernel whose implementation the key cannot read "
                         f"(registered in C++ or before the model was built)")
    if not fns:
        raise NoGraphKey(f"custom op {qual} has no Python implementation the key can read")
    doc: dict[str, Any] = {"op": qual, "schema": str(schema)}
    for key in sorted(fns):
        seen: dict[str, str] = {}
        f = fns[key]
        _callable_document(f, seen)
        doc[key] = {"fn": f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', '')}",
                    "sources": dict(sorted(seen.items()))}
    return doc


# -- torch.export ---------------------------------------------------------------------------------------

def _op_ref(target: Any) -> Any:
    """The canonical form of a call target that is an operator: its name for torch's own, else
    ``{"custom_op": ...}`` (:func:`custom_op_document`)."""
    import torch

    if isinstance(target, torch._ops.OpOverloadPacket):
        target = target.default
    schema = target._schema
    qual = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    if schema.name.split("::")[0] in TORCH_OP_NAMESPACES and not (
            (_WATCHED or {}).get(schema.name) or (_WATCHED or {}).get(qual)):
        return str(target)
    return {"custom_op": custom_op_document(target)}


def _target_name(target: Any) -> Any:
    """The canonical form of a ``call_function`` target, or :class:`NoGraphKey` when the key cannot read
    what it runs."""
    import torch

    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _op_ref(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        if target.name() not in READ_HIGHER_ORDER_OPS:
            raise NoGraphKey(f"a node calls the higher-order op {target.name()}, whose body the key cannot read")
        return f"higher_order.{target.name()}"
    mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if mod and qual and "<" not in qual and _trusted_module(mod):
        return f"{mod}.{qual}"
    name = getattr(target, "__qualname__", None) or repr(target)
    raise NoGraphKey(f"a node calls {name}, whose implementation the key does not read")


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
    if isinstance(a, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):  # auto_functionalized's op
        return {"op": _op_ref(a)}
    raise NoGraphKey(f"a node argument of type {type(a).__name__} has no canonical form")


def _attr(owner: Any, target: str) -> Any:
    obj = owner
    for part in target.split("."):
        if not hasattr(obj, part):
            raise NoGraphKey(f"get_attr {target} names nothing in its graph module")
        obj = getattr(obj, part)
    return obj


def _attr_document(value: Any, target: str) -> Any:
    """What a ``get_attr`` (or ``call_module``) reads: a graph module's document (recursively), a tensor by
    value; anything else (a script object, an opaque module) has no canonical form."""
    import torch
    import torch.fx

    if isinstance(value, torch.fx.GraphModule):
        return {"graph": _graph_document(value)}
    if isinstance(value, torch.Tensor):
        return {"tensor": tensor_digest(value)}
    raise NoGraphKey(f"get_attr {target} reads a {type(value).__name__}, which the key cannot read")


def _graph_document(gm: Any, placeholder: Any = None) -> list[dict[str, Any]]:
    """One entry per node of ``gm.graph``: op, target (or for ``get_attr`` and ``call_module`` the document
    of what it reads, recursively), arguments with node references by index, and the value's shape and
    dtype. ``placeholder(node)`` gives a placeholder's entry fields (the top graph's signature); a body's
    placeholders are its positional inputs."""
    index: dict[Any, int] = {}
    nodes = []
    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        entry: dict[str, Any] = {"op": n.op}
        if n.op == "placeholder":
            if placeholder is not None:
                entry.update(placeholder(n))
        elif n.op == "get_attr":
            entry["value"] = _attr_document(_attr(gm, n.target), n.target)
        elif n.op == "call_module":
            entry["value"] = _attr_document(_attr(gm, n.target), n.target)
            entry["args"] = _fx_arg(tuple(n.args), index)
            entry["kwargs"] = _fx_arg(dict(n.kwargs), index)
        else:
            entry["target"] = n.target if n.op in ("call_method", "output") else _target_name(n.target)
            entry["args"] = _fx_arg(tuple(n.args), index)
            entry["kwargs"] = _fx_arg(dict(n.kwargs), index)
        entry["val"] = _meta_val(n.meta.get("val"))
        nodes.append(entry)
    return nodes


def treespec_document(spec: Any) -> str | None:
    """A pytree spec as text: container types, dict keys, dataclass field names (the names a caller reads).

    Raises:
        NoGraphKey: the spec's text holds an object address (a context that is not plain data).
    """
    if spec is None:
        return None
    text = _MANGLE.sub("", str(spec))
    if re.search(r" at 0x[0-9a-f]+", text):
        raise NoGraphKey("the output's pytree spec holds an object without a stable form")
    return text


def export_document(ep: Any) -> dict[str, Any]:
    """The canonical document of a ``torch.export.ExportedProgram``: ``{"kind": "export", "graph": [...],
    "inputs": [...], "outputs": [...], "in_spec", "out_spec", "weights": [...]}``.

    ``graph`` holds one entry per node (op, target, arguments with node references by index, the shape and
    dtype of its value); a ``get_attr`` of a graph module (a ``cond`` branch, a ``map`` body, an autocast or
    grad-mode region) holds that module's graph, recursively, and a tensor attribute its value; a custom op
    its implementation (:func:`custom_op_document`). ``inputs`` holds the placeholders' kinds and, for
    parameters, buffers and constants, their FQNs; ``weights`` the :func:`tensor_digest` of each parameter,
    buffer (a buffer ``forward`` mutates by its initial value) and constant in graph-input order;
    ``out_spec`` the output's pytree structure with its names.

    Raises:
        NoGraphKey: a custom object input, or anything :func:`_graph_document` cannot read.
    """
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    specs = {s.arg.name: s for s in sig.input_specs if getattr(s.arg, "name", None) is not None}
    inputs, weights = [], []

    def placeholder(n) -> dict:
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
        return {}

    nodes = _graph_document(ep.graph_module, placeholder)
    outputs = [{"kind": s.kind.name.lower(), "target": s.target if s.kind.name != "USER_OUTPUT" else None}
               for s in sig.output_specs]
    call_spec = getattr(ep, "call_spec", None)
    return {"kind": "export", "graph": nodes, "inputs": inputs, "outputs": outputs, "weights": weights,
            "in_spec": treespec_document(getattr(call_spec, "in_spec", None)),
            "out_spec": treespec_document(getattr(call_spec, "out_spec", None))}


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
        GraphHit: the index holds an artifact of this graph key.
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
        print(f"no graph key: {e}; compiling", flush=True)
        write_json_atomic(out, {"graph_key": None, "reason": str(e)})
        return None
    seconds = round(time.monotonic() - t0, 3)
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
           "treespec_document", "watch_custom_ops"]
