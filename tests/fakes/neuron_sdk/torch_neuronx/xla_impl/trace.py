"""Test double of ``torch_neuronx.xla_impl.trace``: the XLA trace path in its steps (tests/fakes/README.md,
"The split XLA path"; facts: /work/shared/hlo-before-neff.md 2.1, 2.2).

``torch_neuronx.trace`` runs :func:`generate_hlo` -> :func:`generate_neff` (looked up as this module's global
at call time, so a caller may patch it, as optimum-neuron's ``neff_cache`` did) -> :func:`create_neuron_model`.
With ``FAKE_TORCH_NEURONX_SPLIT=0`` (read at import) the split functions are absent and trace compiles in one
go, as older releases did.

The HLO module (:class:`HloModuleProto`) imitates the real proto's fields that vary between runs: the module
name (``SyncTensorsGraph.<n>``) and the instruction and computation ids come from a per-process counter that
starts at a random value, and each instruction's ``metadata`` carries ``op_name`` with a per-instance counter,
``source_file`` (an absolute path) and ``source_line``. ``frontend_attributes`` is a map whose order in
``SerializeToString()`` is not stable unless ``deterministic=True`` (as protobuf's).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
from typing import Any, Dict, List, Optional

import torch

from torch_neuronx import _fake_impl as _impl

SPLIT = os.environ.get("FAKE_TORCH_NEURONX_SPLIT", "1").strip().lower() not in ("0", "false", "no")
#: Per-process counter (random start): module names and ids differ between runs, as lowering order does.
_COUNTER = [random.SystemRandom().randrange(1, 10_000) * 100]
#: metaneff digest -> the CPU program the double runs (the real program is in the NEFF; ours cannot run).
_PROGRAMS: Dict[str, Any] = {}


def _next_id() -> int:
    _COUNTER[0] += 1
    return _COUNTER[0]


# --------------------------------------------------------------------------- a protobuf-like message
class _Message:
    """Just enough of protobuf's Message: fields as attributes, ClearField, deepcopy, str(), and
    SerializeToString(deterministic=) over JSON."""

    _defaults: Dict[str, Any] = {}

    def __init__(self, **fields):
        for name, default in self._defaults.items():
            setattr(self, name, copy.deepcopy(default))
        for name, value in fields.items():
            if name not in self._defaults:
                raise AttributeError(f"{type(self).__name__} has no field {name}")
            setattr(self, name, value)

    def ClearField(self, name: str) -> None:  # noqa: N802 (protobuf's name)
        setattr(self, name, copy.deepcopy(self._defaults[name]))

    def CopyFrom(self, other: "_Message") -> None:  # noqa: N802
        for name in self._defaults:
            setattr(self, name, copy.deepcopy(getattr(other, name)))

    def _obj(self, deterministic: bool) -> Dict[str, Any]:
        out = {}
        for name in self._defaults:
            value = getattr(self, name)
            if isinstance(value, _Message):
                value = value._obj(deterministic)
            elif isinstance(value, list):
                value = [v._obj(deterministic) if isinstance(v, _Message) else v for v in value]
            elif isinstance(value, dict):
                items = list(value.items())
                if deterministic:
                    items.sort()
                else:  # protobuf gives no order for map fields without deterministic=True
                    random.shuffle(items)
                value = [[k, v] for k, v in items]
            out[name] = value
        return out

    def SerializeToString(self, deterministic: bool = False) -> bytes:  # noqa: N802
        return json.dumps(self._obj(deterministic), separators=(",", ":")).encode()

    def __str__(self) -> str:  # text format: map keys sorted (as protobuf's text format)
        return json.dumps(self._obj(True), indent=1)


class OpMetadata(_Message):
    _defaults = {"op_type": "", "op_name": "", "source_file": "", "source_line": 0}


class HloInstructionProto(_Message):
    _defaults = {"name": "", "id": 0, "opcode": "", "shape": "", "operand_ids": [], "called_computation_ids": [],
                 "control_predecessor_ids": [], "parameter_number": -1, "literal": "", "metadata": OpMetadata(),
                 "frontend_attributes": {}}


class HloComputationProto(_Message):
    _defaults = {"name": "", "id": 0, "instructions": [], "root_id": 0}


class HloModuleProto(_Message):
    _defaults = {"name": "", "id": 0, "entry_computation_name": "", "entry_computation_id": 0,
                 "computations": [], "stack_frame_index": {}}


class HloArtifacts:
    """What :func:`generate_hlo` returns (fields as NxD reads them)."""

    def __init__(self, hlo_module, flattener, packer, metaneff, weights, constant_parameter_tensors,
                 weight_name_to_idx):
        self.hlo_module = hlo_module
        self.flattener = flattener
        self.packer = packer
        self.metaneff = metaneff
        self.weights = weights
        self.constant_parameter_tensors = constant_parameter_tensors
        self.weight_name_to_idx = weight_name_to_idx


class NeffArtifacts:
    """What :func:`generate_neff` returns."""

    def __init__(self, neff_filename: str):
        self.neff_filename = neff_filename


class Flattener:
    """Flattens the example inputs (picklable, plain data)."""

    def __init__(self, layout: List[str]):
        self.layout = layout


class Packer:
    """Packs the flat outputs into the traced function's output structure (picklable, plain data)."""

    def __init__(self, spec: str):
        self.spec = spec


# --------------------------------------------------------------------------- lowering
def _literal(node) -> str:
    value = node.output().toIValue()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return f"tensor {t.dtype} {list(t.shape)} " + hashlib.sha256(
            t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()
    return repr(value)


def _source(node) -> tuple:
    """(file, line) of the first frame outside torch itself (the model's code), from the node's source range."""
    import re

    torch_dir = os.path.dirname(torch.__file__)
    for line in str(node.sourceRange()).splitlines():
        m = re.match(r"^(.*)\((\d+)\): ", line)
        if m and not m.group(1).startswith(torch_dir):
            return m.group(1), int(m.group(2))
    return "", 0


def _lower(traced, examples, inline_weights: bool):
    """(HloModuleProto, constant_parameter_tensors {index: tensor}, weights {name: tensor})."""
    graph = traced.inlined_graph
    named = dict(list(traced.named_parameters()) + list(traced.named_buffers()))
    comp = HloComputationProto(name=f"IrToHlo.{_next_id()}", id=_next_id())
    ids: Dict[Any, int] = {}
    paths: Dict[Any, str] = {}
    param_of_path: Dict[str, int] = {}
    weights: Dict[str, torch.Tensor] = {}
    constants: Dict[int, torch.Tensor] = {}
    counts: Dict[str, int] = {}
    inputs = list(graph.inputs())
    paths[inputs[0].unique()] = ""
    mode = "inline" if inline_weights else "external"

    def add(opcode, shape, operands=(), **extra) -> int:
        i = _next_id()
        comp.instructions.append(HloInstructionProto(name=f"{opcode.split('::')[-1]}.{i}", id=i, opcode=opcode,
                                                     shape=shape, operand_ids=list(operands), **extra))
        return i

    for index, (value, tensor) in enumerate(zip(inputs[1:], examples)):
        ids[value.unique()] = add("parameter", _impl._tensor_str(tensor), parameter_number=index,
                                  frontend_attributes={"neff_input_names": f"input{index}", "kind": "input"})
    n_inputs = len(examples)
    for path, tensor in named.items():  # every parameter, then every buffer, in module order (as trace does)
        number = n_inputs + len(param_of_path)
        param_of_path[path] = add("parameter", _impl._tensor_str(tensor), parameter_number=number,
                                  frontend_attributes={"kind": "weight", "mode": mode})
        weights[path] = tensor
        constants[number] = tensor
    for node in graph.nodes():
        kind = node.kind()
        outs = list(node.outputs())
        if kind == "prim::GetAttr":
            parent = paths.get(node.input().unique())
            if parent is None:
                raise RuntimeError("the torch_neuronx double cannot lower this attribute access")
            path = f"{parent}.{node.s('name')}".lstrip(".")
            if path in param_of_path:
                ids[outs[0].unique()] = param_of_path[path]
            else:
                paths[outs[0].unique()] = path
            continue
        operands = [ids[v.unique()] for v in node.inputs() if v.unique() in ids]
        shape = ",".join(_impl._type_str(o.type()) for o in outs)
        extra: Dict[str, Any] = {}
        if kind == "prim::Constant":
            extra["literal"] = _literal(node)
        if kind.startswith("aten::"):
            op = kind.split("::")[-1]
            counts[op] = counts.get(op, 0) + 1
            source_file, source_line = _source(node)
            scope = node.scopeName() or type(traced).__name__
            extra["metadata"] = OpMetadata(op_type=kind, op_name=f"{scope}[.{_next_id() % 7}]/aten__{op}",
                                           source_file=source_file, source_line=source_line)
        i = add(kind, shape, operands, **extra)
        for o in outs:
            ids[o.unique()] = i
    root = add("tuple", "(" + ", ".join(_impl._type_str(o.type()) for o in graph.outputs()) + ")",
               [ids[o.unique()] for o in graph.outputs() if o.unique() in ids])
    comp.root_id = root
    module = HloModuleProto(name=f"SyncTensorsGraph.{_next_id()}", id=_next_id(), entry_computation_name=comp.name,
                            entry_computation_id=comp.id, computations=[comp],
                            stack_frame_index={"file_names": os.path.abspath(_impl.__file__)})
    return module, constants, weights


def hlo_text(hlo_module: HloModuleProto, examples, named_weights: Dict[str, torch.Tensor], inline: bool) -> str:
    """``model/graph.hlo`` as the double's neuronx-cc reads it (format: tests/fakes/README.md)."""
    lines = ["# fake HLO written by the torch_neuronx test double (text, not a serialized HloModuleProto)",
             "HloModule graph"]
    for index, tensor in enumerate(examples):
        lines.append(f"input {index} {_impl._tensor_str(tensor)}")
    mode = "inline" if inline else "external"
    for index, (name, tensor) in enumerate(named_weights.items()):
        lines.append(f"param {index} {name} {_impl._tensor_str(tensor)} {mode}")
    comp = hlo_module.computations[0]
    ops = [i for i in comp.instructions if i.opcode.startswith("aten::")]
    for index, inst in enumerate(ops):
        lines.append(f"op {index} {inst.opcode} {inst.shape}")
    root = next(i for i in comp.instructions if i.id == comp.root_id)
    for index, out in enumerate(root.shape[1:-1].split(", ") if root.shape not in ("", "()") else []):
        lines.append(f"output {index} {out}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the steps
def generate_hlo(func, example_inputs, input_output_aliases=None, inline_weights_to_neff=True,
                 return_weights=False, output_aliased_tensor=True, cpu_backend=False,
                 preserve_parameters=False):
    """Lower ``func`` on ``example_inputs`` to an HLO module without compiling; returns :class:`HloArtifacts`."""
    examples = _impl._examples(example_inputs)
    module = func if isinstance(func, torch.nn.Module) else _impl._FunctionModule(func)
    traced = _impl._jit_trace(module, examples)
    hlo, constants, weights = _lower(traced, examples, inline_weights_to_neff)
    with torch.no_grad():
        out = traced(*examples)
    leaves, spec = torch.utils._pytree.tree_flatten(out)
    metaneff = json.dumps({"inputs": [{"name": f"input{i}", "shape": list(t.shape), "dtype": _impl._dtype_name(t.dtype)}
                                      for i, t in enumerate(examples)],
                           "outputs": [{"name": f"output{i}", "shape": list(t.shape)} for i, t in enumerate(leaves)
                                       if isinstance(t, torch.Tensor)]}, sort_keys=True).encode()
    art = HloArtifacts(hlo, Flattener([_impl._tensor_str(t) for t in examples]), Packer(str(spec)), metaneff,
                       None if inline_weights_to_neff else weights, constants,
                       {name: len(examples) + i for i, name in enumerate(weights)})  # -> HLO parameter number
    art._fake_traced = traced          # the double's own: the CPU program behind the NEFF
    art._fake_examples = examples
    art._fake_named = weights
    _PROGRAMS[hashlib.sha256(metaneff).hexdigest() + str(id(traced))] = traced
    return art


def setup_compiler_dirs(hlo_module, compiler_workdir, constant_parameter_tensors, inline_weights_to_neff,
                        _examples=(), _named=None):
    """Write ``<workdir>/model/`` (graph.hlo, weights/<i>.npy, metadata.json); returns that folder."""
    import numpy as np

    model_dir = os.path.join(os.fspath(compiler_workdir), "model")
    os.makedirs(os.path.join(model_dir, "weights"), exist_ok=True)
    paths = {}
    for k, (index, tensor) in enumerate(sorted(constant_parameter_tensors.items())):
        t = tensor.detach().cpu().contiguous()
        array = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        np.save(os.path.join(model_dir, "weights", f"{k}.npy"), array)
        paths[str(k)] = f"weights/{k}.npy"
    with open(os.path.join(model_dir, "metadata.json"), "w") as handle:
        json.dump({"model_files": "graph.hlo", "version": "1.0", "weights": paths}, handle, indent=4)
    named = _named if _named is not None else {f"w{i}": t for i, t in sorted(constant_parameter_tensors.items())}
    with open(os.path.join(model_dir, "graph.hlo"), "w") as handle:
        handle.write(hlo_text(hlo_module, _examples, named, inline_weights_to_neff))
    return model_dir


def hlo_compile(compiler_target, compiler_workdir=None, compiler_args=None):
    """Run neuronx-cc on ``compiler_target``; returns ``<workdir>/graph.neff``. RuntimeError on failure."""
    return _impl._hlo_compile(compiler_target, os.fspath(compiler_workdir), _impl._normalize_args(compiler_args))


def generate_neff(hlo_artifacts, compiler_workdir=None, compiler_args=None, inline_weights_to_neff=True):
    """setup_compiler_dirs + hlo_compile; returns :class:`NeffArtifacts`."""
    target = setup_compiler_dirs(hlo_artifacts.hlo_module, compiler_workdir, hlo_artifacts.constant_parameter_tensors,
                                 inline_weights_to_neff, getattr(hlo_artifacts, "_fake_examples", ()),
                                 getattr(hlo_artifacts, "_fake_named", None))
    return NeffArtifacts(hlo_compile(target, compiler_workdir=compiler_workdir, compiler_args=compiler_args))


def create_neuron_model(neff_filename, metaneff, flattener, packer, example_inputs, input_output_aliases, weights):
    """The TorchScript module ``trace`` returns: the NEFF's bytes in a buffer, the program behind it."""
    with open(neff_filename, "rb") as handle:
        neff = handle.read()
    traced = _PROGRAMS.pop(next(k for k in list(_PROGRAMS) if k.startswith(hashlib.sha256(metaneff).hexdigest())))
    examples = _impl._examples(example_inputs)
    spec = json.dumps([{"shape": list(t.shape), "dtype": _impl._dtype_name(t.dtype)} for t in examples])
    return _impl._jit_trace(_impl.NeuronModule(traced, neff, spec, separated=weights is not None), examples)


def split_trace(func, example_inputs, args: List[str], workdir: str, inline_weights_to_neff: bool,
                input_output_aliases: Optional[dict] = None):
    """What ``torch_neuronx.trace`` does when the split functions exist (module globals looked up now)."""
    import sys

    this = sys.modules[__name__]
    art = this.generate_hlo(func, example_inputs, input_output_aliases or {},
                            inline_weights_to_neff=inline_weights_to_neff, cpu_backend=True)
    neff = this.generate_neff(art, compiler_workdir=workdir, compiler_args=args,
                              inline_weights_to_neff=inline_weights_to_neff)
    return this.create_neuron_model(neff.neff_filename, art.metaneff, art.flattener, art.packer,
                                    example_inputs, input_output_aliases or {}, art.weights)


if not SPLIT:  # an older torch_neuronx: trace compiles in one go, none of these exist
    del generate_hlo, setup_compiler_dirs, hlo_compile, generate_neff, create_neuron_model, NeffArtifacts
