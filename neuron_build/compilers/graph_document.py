"""The canonical document of a ``torch.export`` program, and of the custom ops it calls, for the graph key.

Split from :mod:`neuron_build.compilers.graph_key` (which re-exports every public name here, and whose
docstring describes the canonical forms): the FX graph with every cosmetic fact removed, its submodules
(``torch.cond`` branches, ``map`` bodies, ...) read recursively, weights by content, and a ``torch.library``
custom op keyed by its registered Python implementations (:func:`watch_custom_ops`). Anything it cannot
read raises :class:`NoGraphKey`: the key fails closed.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from neuron_build.errors import NeuronBuildError
from neuron_build.util import sha256_hex

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
#: The mangling counter of TorchScript class names (``___torch_mangle_N.``), also in pytree specs: left out.
TORCH_MANGLE = re.compile(r"___torch_mangle_\d+\.")


class NoGraphKey(NeuronBuildError):
    """The graph holds something the canonical form does not understand; the reason is one line."""


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
        return {"graph": graph_module_document(value)}
    if isinstance(value, torch.Tensor):
        return {"tensor": tensor_digest(value)}
    raise NoGraphKey(f"get_attr {target} reads a {type(value).__name__}, which the key cannot read")


def graph_module_document(gm: Any, placeholder: Any = None) -> list[dict[str, Any]]:
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
    text = TORCH_MANGLE.sub("", str(spec))
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
        NoGraphKey: a custom object input, or anything :func:`graph_module_document` cannot read.
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

    nodes = graph_module_document(ep.graph_module, placeholder)
    outputs = [{"kind": s.kind.name.lower(), "target": s.target if s.kind.name != "USER_OUTPUT" else None}
               for s in sig.output_specs]
    call_spec = getattr(ep, "call_spec", None)
    return {"kind": "export", "graph": nodes, "inputs": inputs, "outputs": outputs, "weights": weights,
            "in_spec": treespec_document(getattr(call_spec, "in_spec", None)),
            "out_spec": treespec_document(getattr(call_spec, "out_spec", None))}


__all__ = ["NoGraphKey", "READ_HIGHER_ORDER_OPS", "TORCH_MANGLE", "TORCH_OP_NAMESPACES", "custom_op_document",
           "export_document", "graph_module_document", "tensor_digest", "treespec_document", "watch_custom_ops"]
