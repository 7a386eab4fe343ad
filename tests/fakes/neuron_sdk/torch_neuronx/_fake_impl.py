"""Implementation of the torch-neuronx test double (shared by the neuron_sdk and other_torch roots).

What it imitates and what it guesses is written down in tests/fakes/README.md.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import warnings
from typing import Any, Callable, Dict, List, Optional, Union

import torch
import torch.utils._pytree

logger = logging.getLogger("Neuron")

SIGNATURES = ("2.7", "2.16", "2.21")
SIGNATURE = os.environ.get("FAKE_TORCH_NEURONX_SIGNATURE", "2.21").strip() or "2.21"
if SIGNATURE not in SIGNATURES:
    raise ImportError(
        f"torch_neuronx test double: FAKE_TORCH_NEURONX_SIGNATURE={SIGNATURE!r} is not one of {SIGNATURES}"
    )

_HLO_DTYPES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "s64", torch.int32: "s32", torch.int16: "s16", torch.int8: "s8",
    torch.uint8: "u8", torch.bool: "pred",
}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def has_neuron_device() -> bool:
    """The double's idea of "this host has a NeuronCore": FAKE_NEURON_HAS_DEVICE is set (not 0)."""
    return _truthy("FAKE_NEURON_HAS_DEVICE")


def _no_device_error() -> RuntimeError:
    return RuntimeError(
        "Neuron runtime initialization failed: no Neuron device was found on this host "
        "(/dev/neuron* is missing; nrt status 1). Run on an inf2/trn1/trn2 instance, or trace "
        "with cpu_backend=True and a --target in compiler_args."
    )


# --------------------------------------------------------------------------- runtime op
# The saved ScriptModule calls torch.ops.neuron.fake_check_inputs, registered below when
# torch_neuronx is imported. As with the real package (whose models hold a
# torch.classes.neuron.Model), torch.jit.load of a traced model fails unless torch_neuronx was
# imported first.

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_inputs_kernel(inputs: List[torch.Tensor], neff: torch.Tensor, spec: str) -> List[torch.Tensor]:
    expected = json.loads(spec)
    if _truthy("FAKE_NEURON_RUN_NEEDS_DEVICE") and not has_neuron_device():
        raise _no_device_error()
    if len(inputs) != len(expected):
        raise RuntimeError(
            f"Neuron model called with {len(inputs)} input tensors; it was compiled for {len(expected)}"
        )
    for index, (tensor, want) in enumerate(zip(inputs, expected)):
        got_shape, got_dtype = list(tensor.shape), _dtype_name(tensor.dtype)
        if got_shape != want["shape"] or got_dtype != want["dtype"]:
            raise RuntimeError(
                f"Neuron model input {index}: expected shape {want['shape']} dtype {want['dtype']}, "
                f"got shape {got_shape} dtype {got_dtype}. A compiled Neuron model only accepts the "
                f"shapes and dtypes it was traced with."
            )
    return [tensor.view_as(tensor) for tensor in inputs]


def _outputs_kernel(outputs: List[torch.Tensor]) -> List[torch.Tensor]:
    return [tensor.detach() for tensor in outputs]


def _register_runtime_op() -> None:
    # Kept on the torch module so a re-import of this module never drops or re-defines the op.
    if getattr(torch, "_fake_neuron_library", None) is not None:
        return
    lib = torch.library.Library("neuron", "FRAGMENT")
    lib.define("fake_check_inputs(Tensor[] inputs, Tensor neff, str spec) -> Tensor[]")
    lib.impl("fake_check_inputs", _check_inputs_kernel, "CompositeExplicitAutograd")
    # Outputs of a Neuron model never require grad (they come out of the runtime); implicit
    # autograd makes the detach visible to autograd while tracing still records this one op.
    lib.define("fake_outputs(Tensor[] outputs) -> Tensor[]")
    lib.impl("fake_outputs", _outputs_kernel, "CompositeImplicitAutograd")
    torch._fake_neuron_library = lib


_register_runtime_op()


class NeuronModule(torch.nn.Module):
    """What trace returns (after torch.jit.trace): input check + the traced model, NEFF in a buffer."""

    def __init__(self, model: torch.jit.ScriptModule, neff: bytes, spec: str, separated: bool = False) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("neff", torch.frombuffer(bytearray(neff), dtype=torch.uint8).clone())
        # the double's mark of a model traced with inline_weights_to_neff=False (it holds separated weights)
        self.register_buffer("weights_separated", torch.tensor(bool(separated)))
        self.spec = spec

    def forward(self, *tensors):
        checked = torch.ops.neuron.fake_check_inputs(list(tensors), self.neff, self.spec)
        result = self.model(*checked)
        leaves, structure = torch.utils._pytree.tree_flatten(result)
        where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        if not where:
            return result
        outputs = torch.ops.neuron.fake_outputs([leaves[i] for i in where])
        for i, tensor in zip(where, outputs):
            leaves[i] = tensor
        return torch.utils._pytree.tree_unflatten(leaves, structure)


class _FunctionModule(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *tensors):
        return self.fn(*tensors)


# --------------------------------------------------------------------------- HLO text

def _type_str(value_type) -> str:
    if isinstance(value_type, torch._C.TensorType):
        sizes = value_type.sizes()
        dtype = value_type.dtype()
        name = _HLO_DTYPES.get(dtype, str(dtype).replace("torch.", "")) if dtype is not None else "?"
        dims = ",".join(str(s) for s in sizes) if sizes is not None else "?"
        return f"{name}[{dims}]"
    return str(value_type).replace(" ", "")


def _tensor_str(tensor: torch.Tensor) -> str:
    name = _HLO_DTYPES.get(tensor.dtype, _dtype_name(tensor.dtype))
    return f"{name}[{','.join(str(s) for s in tensor.shape)}]"


def _jit_trace(module, examples):
    # torch 2.13 marks torch.jit.trace deprecated; the double's own use of it should not warn.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.trace(module, examples, check_trace=False, strict=False)


def _aten_nodes(graph) -> List[Any]:
    found = []

    def walk(block):
        for node in block.nodes():
            if node.kind().startswith("aten::"):
                found.append(node)
            for sub in node.blocks():
                walk(sub)

    walk(graph)
    return found


def _aten_ops(traced) -> List[str]:
    return [node.kind() for node in _aten_nodes(traced.inlined_graph)]


def _hlo_text(traced, examples, inline_weights: bool) -> str:
    """Deterministic text standing in for the HloModuleProto (format in tests/fakes/README.md)."""
    graph = traced.inlined_graph
    lines = [
        "# fake HLO written by the torch_neuronx test double (text, not a serialized HloModuleProto)",
        "HloModule graph",
    ]
    for index, tensor in enumerate(examples):
        lines.append(f"input {index} {_tensor_str(tensor)}")
    mode = "inline" if inline_weights else "external"
    named = list(traced.named_parameters()) + list(traced.named_buffers())
    for index, (name, tensor) in enumerate(named):
        lines.append(f"param {index} {name} {_tensor_str(tensor)} {mode}")
    for index, node in enumerate(_aten_nodes(graph)):
        types = ",".join(_type_str(out.type()) for out in node.outputs())
        lines.append(f"op {index} {node.kind()} {types}")
    for index, out in enumerate(graph.outputs()):
        lines.append(f"output {index} {_type_str(out.type())}")
    return "\n".join(lines) + "\n"


def _write_weights(model_dir: str, traced) -> Dict[str, str]:
    import numpy as np

    os.makedirs(os.path.join(model_dir, "weights"), exist_ok=True)
    paths = {}
    named = list(traced.named_parameters()) + list(traced.named_buffers())
    for index, (_name, tensor) in enumerate(named):
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.bfloat16:
            array = tensor.view(torch.int16).numpy()
        else:
            array = tensor.numpy()
        rel = f"weights/{index}.npy"
        np.save(os.path.join(model_dir, rel), array)
        paths[str(index)] = rel
    return paths


# --------------------------------------------------------------------------- compile

def _normalize_args(compiler_args) -> List[str]:
    if compiler_args is None:
        return []
    if isinstance(compiler_args, str):
        return shlex.split(compiler_args)
    return [str(arg) for arg in compiler_args]


def _target_in(args: List[str]) -> Optional[str]:
    target = None
    for index, arg in enumerate(args):
        if arg == "--target" and index + 1 < len(args):
            target = args[index + 1]
        elif arg.startswith("--target="):
            target = arg.split("=", 1)[1]
    return target


def _examples(example_inputs) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise TypeError("example_inputs must be a tensor or a tuple of tensors (the test double "
                    f"supports nothing else), got {type(example_inputs).__name__}")


def _hlo_compile(model_dir: str, workdir: str, args: List[str]) -> str:
    try:
        import neuronxcc  # noqa: F401  (the real wrapper checks the same import)
    except ImportError as exc:
        raise RuntimeError("neuronx-cc is not installed (the neuronxcc package cannot be imported)") from exc
    neff = os.path.join(workdir, "graph.neff")
    compiler = shutil.which("neuronx-cc")
    if compiler is None:
        raise RuntimeError("the neuronx-cc executable was not found on PATH")
    target = _target_in(args) or "trn1"
    command = [compiler, "compile", model_dir, "--framework", "XLA", "--target", target,
               "--output", neff] + args
    with open(os.path.join(workdir, "command.txt"), "w") as handle:
        handle.write(" ".join(os.path.basename(str(item)) for item in command))
    status = subprocess.run(command).returncode
    if status != 0:
        if status == -9:
            logger.warning("neuronx-cc was killed by SIGKILL; the usual cause is the kernel's "
                           "out-of-memory killer. Compile on a host with more memory.")
        raise RuntimeError(f"neuronx-cc failed with {status}")
    return neff


def _compile(func, example_inputs, *, input_output_aliases=None, compiler_workdir=None,
             compiler_args=None, partitioner_config=None, inline_weights_to_neff=True,
             cpu_backend=False, check_device=True, extra_files=None):
    args = _normalize_args(compiler_args)
    if cpu_backend:
        if _target_in(args) is None:
            raise ValueError("cpu_backend=True needs the hardware target in compiler_args, "
                             "e.g. compiler_args=['--target', 'trn1']")
    elif check_device and not has_neuron_device():
        raise _no_device_error()
    if partitioner_config is not None:
        raise NotImplementedError("the torch_neuronx test double does not implement partitioner_config")
    if input_output_aliases and not isinstance(input_output_aliases, dict):
        raise TypeError("input_output_aliases must be a dict")
    examples = _examples(example_inputs)
    from torch_neuronx.xla_impl import trace as xla_trace

    context = contextlib.nullcontext(compiler_workdir)
    if compiler_workdir is None:
        context = tempfile.TemporaryDirectory(prefix="fake-neuronx-")
    with context as workdir:
        workdir = os.fspath(workdir)
        os.makedirs(workdir, exist_ok=True)
        if xla_trace.SPLIT and not extra_files:  # generate_hlo -> generate_neff -> create_neuron_model
            return xla_trace.split_trace(func, examples, args, workdir, inline_weights_to_neff,
                                         input_output_aliases)
        module = func if isinstance(func, torch.nn.Module) else _FunctionModule(func)
        traced = _jit_trace(module, examples)
        model_dir = os.path.join(workdir, "model")
        os.makedirs(model_dir, exist_ok=True)
        weights = _write_weights(model_dir, traced)
        with open(os.path.join(model_dir, "metadata.json"), "w") as handle:
            json.dump({"model_files": "graph.hlo", "version": "1.0", "weights": weights}, handle, indent=4)
        with open(os.path.join(model_dir, "graph.hlo"), "w") as handle:
            handle.write(_hlo_text(traced, examples, inline_weights_to_neff))
        for name, data in (extra_files or {}).items():
            with open(os.path.join(workdir, name), "wb") as handle:
                handle.write(data)
        neff_path = _hlo_compile(model_dir, workdir, args)
        with open(neff_path, "rb") as handle:
            neff = handle.read()

    spec = json.dumps([{"shape": list(t.shape), "dtype": _dtype_name(t.dtype)} for t in examples])
    return _jit_trace(NeuronModule(traced, neff, spec, separated=not inline_weights_to_neff), examples)


# --------------------------------------------------------------------------- public API
# The signature of `trace` depends on FAKE_TORCH_NEURONX_SIGNATURE, read once at import. Unknown
# keyword arguments raise TypeError here (the real function warns instead; see README).

if SIGNATURE == "2.7":

    def trace(func: Union[Callable, torch.nn.Module], example_inputs: Any, *,
              compiler_workdir=None, compiler_args=None) -> torch.jit.ScriptModule:
        """Trace and compile `func` for Neuron (test double, SDK 2.7 signature)."""
        return _compile(func, example_inputs, compiler_workdir=compiler_workdir,
                        compiler_args=compiler_args)

elif SIGNATURE == "2.16":

    def trace(func: Union[Callable, torch.nn.Module], example_inputs: Any, *_,
              input_output_aliases: Dict = {}, compiler_workdir=None, compiler_args=None,
              partitioner_config=None, inline_weights_to_neff=True) -> torch.jit.ScriptModule:
        """Trace and compile `func` for Neuron (test double, SDK 2.16 signature)."""
        if _:
            raise TypeError("trace() takes 2 positional arguments; pass the others by keyword")
        return _compile(func, example_inputs, input_output_aliases=input_output_aliases,
                        compiler_workdir=compiler_workdir, compiler_args=compiler_args,
                        partitioner_config=partitioner_config,
                        inline_weights_to_neff=inline_weights_to_neff)

else:

    def trace(func: Union[Callable, torch.nn.Module], example_inputs: Any, *_,
              input_output_aliases: Dict = {}, compiler_workdir=None, compiler_args=None,
              partitioner_config=None, inline_weights_to_neff=True,
              cpu_backend=False) -> torch.jit.ScriptModule:
        """Trace and compile `func` for Neuron (test double, SDK 2.21+ signature)."""
        if _:
            raise TypeError("trace() takes 2 positional arguments; pass the others by keyword")
        return _compile(func, example_inputs, input_output_aliases=input_output_aliases,
                        compiler_workdir=compiler_workdir, compiler_args=compiler_args,
                        partitioner_config=partitioner_config,
                        inline_weights_to_neff=inline_weights_to_neff, cpu_backend=cpu_backend)


def analyze(func, example_inputs, compiler_workdir=None, additional_ignored_ops=set(),
            max_workers=4, is_hf_transformers=False, cleanup=False) -> dict:
    """Operator support report, shaped like the documented one (no compiler is run).

    Operators named in FAKE_TORCH_NEURONX_UNSUPPORTED (comma separated, e.g. "aten::relu") are
    reported as unsupported.
    """
    import neuronxcc
    import torch_neuronx

    examples = _examples(example_inputs)
    module = func if isinstance(func, torch.nn.Module) else _FunctionModule(func)
    traced = _jit_trace(module, examples)
    ignored = set(additional_ignored_ops or ())
    unsupported_names = {name.strip() for name in
                         os.environ.get("FAKE_TORCH_NEURONX_UNSUPPORTED", "").split(",") if name.strip()}
    supported: Dict[str, int] = collections.Counter()
    unsupported: List[dict] = []
    for node in _aten_nodes(traced.inlined_graph):
        kind = node.kind()
        if kind in ignored:
            continue
        if kind in unsupported_names:
            unsupported.append({"kind": kind, "failureAt": "neuronx-cc", "call": "",
                                "opGraph": str(node).strip()})
        else:
            supported[kind] += 1
    total = sum(supported.values()) + len(unsupported)
    percentage = 100.0 * sum(supported.values()) / total if total else 100.0
    return {
        "torch_neuronx_version": torch_neuronx.__version__,
        "neuronx_cc_version": neuronxcc.__version__,
        "support_percentage": f"{percentage:.2f}%",
        "supported_operators": dict(supported),
        "unsupported_operators": unsupported,
    }


def replace_weights(neuron_model, weights) -> None:
    """Replace the separated weights of a model traced with ``inline_weights_to_neff=False``, in place [doc:
    torch-neuronx API reference, replace_weights]: ``weights`` is the original model with the new weights or a
    state_dict; returns None; a model without separated weights gets a warning and nothing is replaced [doc].

    What the docs leave open, the double decides strictly [guess]: a name the model does not hold, or a tensor
    whose shape or dtype differs from the one traced, raises RuntimeError before anything is replaced; names
    the state dict does not give (non-persistent buffers) keep their traced values.
    """
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else dict(weights)
    flag = getattr(neuron_model, "weights_separated", None)
    if not isinstance(flag, torch.Tensor) or not bool(flag.item()):
        warnings.warn("torch_neuronx.replace_weights: the Neuron model does not contain any separated weights "
                      "(it was traced with inline_weights_to_neff=True); nothing was replaced")
        return None
    program = neuron_model.model
    held = dict(program.named_parameters())
    held.update(dict(program.named_buffers()))
    for name, tensor in state.items():
        if name not in held:
            raise RuntimeError(f"replace_weights: the Neuron model has no separated weight named {name!r}")
        have = held[name]
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(have.shape) or tensor.dtype != have.dtype:
            got = f"{tensor.dtype} {list(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise RuntimeError(f"replace_weights: weight {name!r} is {got}; the Neuron model was traced with "
                               f"{have.dtype} {list(have.shape)}")
    with torch.no_grad():
        for name, tensor in state.items():
            held[name].copy_(tensor)
    return None


def move_trace_to_device(trace, device_id):
    """Real: places a loaded model's state on NeuronCore `device_id`. Fake: needs a device, else no-op."""
    if not has_neuron_device():
        raise _no_device_error()
    return None
