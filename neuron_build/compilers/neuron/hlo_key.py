"""The graph key of the XLA path, made from the HLO module **before** neuronx-cc runs.

``torch_neuronx.trace`` lowers the model to an HLO module (``generate_hlo``), compiles it
(``generate_neff``: ``setup_compiler_dirs`` + ``hlo_compile``, which runs neuronx-cc) and assembles the
TorchScript module (``create_neuron_model``) [code: NxD, NxDI and optimum-neuron call these functions of
``torch_neuronx.xla_impl.trace``; facts in ``hlo-before-neff.md`` 2.1]. :class:`NeffHook` replaces
``generate_neff`` for the length of one ``trace`` call (optimum-neuron's ``neff_cache`` pattern [code]):
the hook canonicalises a copy of the HLO module, makes the graph key and asks the graph index
(:func:`neuron_build.compilers.graph_key.checkpoint`); on a hit it raises
:class:`~neuron_build.compilers.graph_key.GraphHit` before neuronx-cc runs and the builder publishes the
artifact compiled from the same graph; on a miss it calls the original ``generate_neff`` and trace
assembles the artifact as it always does.

The document keyed (:func:`hlo_document`), everything ``model.pt`` is made of:

- the HLO module, canonical (:func:`canonical_hlo`): instruction ``metadata`` (``op_name`` with its
  per-instance counters, ``source_file``, ``source_line``) cleared; module, computation and instruction
  names and ids renumbered structurally (they are handed out in lowering order [inference, facts 3]);
  the stack-frame index (file names) cleared, and for a protobuf message dropped on the wire (field 17)
  whatever the schema that parsed it; everything else kept, serialised with
  ``SerializeToString(deterministic=True)`` (map fields such as ``frontend_attributes`` have no order
  otherwise [protobuf]). A field the copy does not understand, read on the wire whatever the schema (one of
  a newer XLA, the ``schedule`` and ``original_value``, which name instructions by id or name), or an id
  defined twice: no key. On real torch-xla 2.9 HLO (``tests/compilers/neuron/real_hlo/``) debug metadata, a
  moved folder, a comment edit, new weights and a second lowering in one process keep the key [ran]. A
  scalar literal of ``forward`` (``x / 4.0``) is an HLO *parameter* there, not a constant: the module is
  the same bytes for ``/ 8.0`` [ran], so the parameters' values (the weights below) must be in the key.
  The proto that is compiled is never touched;
- the weights by content: the inlined ones (``constant_parameter_tensors``, folded into the NEFF [code,
  1.13 copy]) and the external ones (``weights``, which travel in ``model.pt``), as
  ``(index, dtype, shape, sha256)``;
- the metaneff, the flattener and the packer (the input and output structure ``create_neuron_model``
  builds into ``model.pt``): by their bytes, deterministic serialisation or pickle;
- the compiler flags without path-valued or logging flags (:func:`canonical_flags`: ``--logfile``,
  ``--verbose``, ``--output``, ``--cache_dir``), and the version the neuronx-cc executable reports;
- with the source key's other components from the builder (``base``: input shapes and dtypes, backend,
  hardware target, profile options, environment, toolchain versions).

Whatever of this cannot be read (an attribute missing, an object that does not pickle) means no graph key
and the target compiles: the key fails closed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import pickle
import shlex
import sys
from collections.abc import Iterator
from typing import Any

from neuron_build.compilers import graph_key as gk
from neuron_build.compilers.neuron.hlo import wire_fields, without_fields

#: The module whose functions the split path relies on [code: NxD trace/functions.py, optimum cache.py].
XLA_TRACE_MODULE = "torch_neuronx.xla_impl.trace"
#: function -> the parameters the hook needs it to have (``inspect.signature``), from how NxD and optimum
#: call it [code]; ``NeffArtifacts(neff_filename)`` is what the hook returns.
REQUIRED = {"generate_neff": ("hlo_artifacts", "compiler_workdir", "compiler_args", "inline_weights_to_neff")}
#: Flags whose value is a path or only changes logging: never in the key (``--logfile=<abs workdir>`` is
#: what makes NxD's own ``get_hash_module`` depend on the work directory [code]).
DROPPED_FLAGS = ("--logfile", "--verbose", "--output", "--cache_dir", "--cache-dir", "--dump", "--pipeline-dump")
#: Fields of an instruction and of the module that are cosmetic (cleared in the canonical copy).
_COSMETIC_MODULE_FIELDS = ("stack_frame_index",)
#: ``HloModuleProto.stack_frame_index`` [code: XLA hlo.proto]: file names and lines under ``XLA_IR_DEBUG``;
#: a schema without it keeps it as unknown bytes [ran: shared/weights-and-real-hlo.md 1.4], so it is
#: dropped on the wire too.
_COSMETIC_MODULE_FIELD_NUMBERS = frozenset({17})
#: The fields the canonical copy understands, by message [code: xla/service/hlo.proto, openxla/xla 0b8fa9f]:
#: renumbered (ids), renamed (names), cleared (metadata, 17) or kept as they are because they hold no
#: instruction or computation id, no name and no path (shapes, literals, dimensions, shardings, aliasing by
#: parameter number, frontend attributes, backend config). Any other field, of a newer XLA or a removed one
#: (``operand_names`` 4 ...), gives no key: it might refer to what the copy renumbers [house rule: fail closed].
_MODULE_FIELDS = frozenset({1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 13, 14, 15, 16, 18, 19})
_COMPUTATION_FIELDS = frozenset({1, 2, 4, 5, 6, 7, 8})
_INSTRUCTION_FIELDS = frozenset({1, 2, 3, 7, 8, 9, *range(11, 41), 43, 45, *range(47, 53), *range(54, 64),
                                 *range(65, 78), 79, 80, 81, 82, 85, 86, 87, 89, 90, 91}) - {12, 39}
#: Fields XLA defines that the key refuses: what they hold is not renumbered or renamed in the copy.
_REFUSED = {("module", 7): "the schedule (instruction ids by computation id)",
            ("instruction", 88): "original_value (instructions by their lowering-order names)"}
FALLBACK_WARNING = ("torch_neuronx.xla_impl.trace has no {what}: the HLO graph key is made after neuronx-cc runs "
                    "(today's path), so a graph-neutral edit still compiles")


def split_api() -> tuple[Any, str | None]:
    """(the ``torch_neuronx.xla_impl.trace`` module, None) when the hook can work with the installed
    torch-neuronx, else (None, what is missing: one phrase for :data:`FALLBACK_WARNING`)."""
    try:
        mod = __import__(XLA_TRACE_MODULE, fromlist=["generate_neff"])
    except Exception as e:  # ImportError, or anything a broken build raises
        return None, f"importable {XLA_TRACE_MODULE} ({type(e).__name__})"
    for name, needed in REQUIRED.items():
        fn = getattr(mod, name, None)
        if not callable(fn):
            return None, f"{name}()"
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return None, f"inspectable {name}()"
        missing = [p for p in needed if p not in params]
        if missing:
            return None, f"{name}() with the parameters {', '.join(missing)}"
    if not callable(getattr(mod, "NeffArtifacts", None)):
        return None, "NeffArtifacts"
    return mod, None


def canonical_flags(args: list[str] | str | None) -> list[str]:
    """Compiler flags as the key takes them: ``shlex`` split, in order, without :data:`DROPPED_FLAGS`
    (``--flag=value`` or ``--flag value``)."""
    items = shlex.split(args) if isinstance(args, str) else [str(a) for a in (args or [])]
    out: list[str] = []
    skip = False
    for a in items:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in DROPPED_FLAGS:
            skip = "=" not in a  # every one of them takes a value: ``--flag value`` drops two items
            continue
        out.append(a)
    return out


def _renumber(values: Any, mapping: dict[int, int], what: str) -> None:
    try:
        new = [mapping[int(v)] for v in values]
    except KeyError as e:
        raise gk.NoGraphKey(f"the HLO module refers to {what} {e.args[0]}, which it does not define") from None
    del values[:]
    values.extend(new)


def _understood(data: bytes, what: str = "module") -> None:
    """Raise NoGraphKey naming the first field of ``data`` (the canonical bytes of an HloModuleProto, or of
    one of its computations or instructions) that the key does not understand (:data:`_MODULE_FIELDS`)."""
    known = {"module": _MODULE_FIELDS, "computation": _COMPUTATION_FIELDS, "instruction": _INSTRUCTION_FIELDS}[what]
    inner = {"module": (3, "computation"), "computation": (2, "instruction")}.get(what)
    for number, _, value, _, _ in wire_fields(data):
        if number not in known:
            why = _REFUSED.get((what, number), "unknown to the HLO key")
            raise gk.NoGraphKey(f"the HLO {what} has field {number}: {why}; the target compiles (teach "
                                f"neuron_build/compilers/neuron/hlo_key.py what it holds to key it)")
        if inner and number == inner[0]:
            if not isinstance(value, bytes):
                raise gk.NoGraphKey(f"the HLO {what}'s field {number} is not a message")
            _understood(value, inner[1])


def _ids(items: Any, what: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for item in items:
        if int(item.id) in out:
            raise gk.NoGraphKey(f"the HLO module defines {what} id {int(item.id)} twice")
        out[int(item.id)] = len(out)
    return out


def canonical_hlo(module: Any) -> bytes:
    """The canonical bytes of an ``HloModuleProto`` (see the module docstring); ``module`` is not changed.

    Raises:
        NoGraphKey: the module lacks the fields this relies on, or refers to an id it does not define.
    """
    try:
        m = copy.deepcopy(module)
        comps = list(m.computations)
        comp_ids = _ids(comps, "computation")
        inst_ids = _ids([inst for c in comps for inst in c.instructions], "instruction")
        for n, c in enumerate(comps):
            c.name, c.id = f"computation.{n}", n
            c.root_id = inst_ids[int(c.root_id)]
            for inst in c.instructions:
                inst.id = inst_ids[int(inst.id)]
                inst.name = f"instruction.{inst.id}"
                _renumber(inst.operand_ids, inst_ids, "instruction")
                _renumber(inst.control_predecessor_ids, inst_ids, "instruction")
                _renumber(inst.called_computation_ids, comp_ids, "computation")
                inst.ClearField("metadata")
        entry = comp_ids[int(m.entry_computation_id)]
        m.name, m.id = "module", 0
        m.entry_computation_name, m.entry_computation_id = f"computation.{entry}", entry
        for f in _COSMETIC_MODULE_FIELDS:
            if hasattr(m, f):
                m.ClearField(f)
        data = m.SerializeToString(deterministic=True)
        if hasattr(m, "DESCRIPTOR"):  # a protobuf message: its bytes are the wire format
            try:
                data = without_fields(data, _COSMETIC_MODULE_FIELD_NUMBERS)
                _understood(data)
            except ValueError as e:
                raise gk.NoGraphKey(f"the HLO module is not well-formed protobuf wire format ({e})") from None
        return data
    except gk.NoGraphKey:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise gk.NoGraphKey(f"the HLO module has no canonical form here ({type(e).__name__}: {e})") from None


def _weights(value: Any, what: str) -> list:
    if value is None:
        return []
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        items = [("", value)]
    out = []
    for k, t in items:
        if not hasattr(t, "detach"):
            raise gk.NoGraphKey(f"{what} {k} is a {type(t).__name__}, not a tensor")
        out.append([str(k), gk.tensor_digest(t)])
    return out


def _object_digest(obj: Any, what: str) -> str | None:
    if obj is None:
        return None
    if isinstance(obj, (bytes, bytearray)):
        return hashlib.sha256(bytes(obj)).hexdigest()
    ser = getattr(obj, "SerializeToString", None)
    if callable(ser):
        try:
            return hashlib.sha256(ser(deterministic=True)).hexdigest()
        except TypeError:
            pass
    try:
        return hashlib.sha256(pickle.dumps(obj, protocol=4)).hexdigest()
    except Exception as e:
        raise gk.NoGraphKey(f"the {what} has no canonical form ({type(e).__name__})") from None


def hlo_document(hlo_artifacts: Any, compiler_args: Any, inline_weights_to_neff: bool,
                 compiler_version: str | None) -> dict[str, Any]:
    """The canonical document of one lowering (``HloArtifacts`` from ``generate_hlo``) for the graph key.

    Returns:
        ``{"kind": "neuron-hlo", "module": sha256 of :func:`canonical_hlo`, "inlined_weights": [[index,
        digest]], "external_weights": [[name, digest]], "metaneff", "flattener", "packer": sha256,
        "flags": [...], "inline_weights_to_neff": bool, "neuronx_cc": version}``.

    Raises:
        NoGraphKey: a part the key cannot read (the key fails closed: the target compiles).
    """
    missing = [a for a in ("hlo_module", "constant_parameter_tensors", "metaneff", "flattener", "packer", "weights")
               if not hasattr(hlo_artifacts, a)]
    if missing:
        raise gk.NoGraphKey(f"generate_hlo's result has no {', '.join(missing)}")
    return {
        "kind": "neuron-hlo",
        "module": hashlib.sha256(canonical_hlo(hlo_artifacts.hlo_module)).hexdigest(),
        "inlined_weights": _weights(hlo_artifacts.constant_parameter_tensors, "inlined weight"),
        "external_weights": _weights(hlo_artifacts.weights, "weight"),
        "metaneff": _object_digest(hlo_artifacts.metaneff, "metaneff"),
        "flattener": _object_digest(hlo_artifacts.flattener, "input flattener"),
        "packer": _object_digest(hlo_artifacts.packer, "output packer"),
        "flags": canonical_flags(compiler_args),
        "inline_weights_to_neff": bool(inline_weights_to_neff),
        "neuronx_cc": compiler_version,
    }


class NeffHook:
    """``generate_neff`` replaced, for one ``trace`` call, by a graph-key lookup before the compile.

    Use::

        hook = NeffHook(module, request, compiler_version)
        with hook.installed():
            torch_neuronx.trace(...)       # GraphHit propagates on a hit: nothing compiled
        hook.called                        # False: this trace did not go through generate_neff

    Attributes:
        called: the hook ran (trace went through ``generate_neff``).
        key: the graph key it made (None: not asked for, or no canonical form).
        hit: the graph key when the graph index held it (GraphHit was raised), else None.
    """

    def __init__(self, module: Any, request: Any, compiler_version: str | None):
        self.module, self.request, self.compiler_version = module, request, compiler_version
        self.original = module.generate_neff
        self.called = False
        self.key: str | None = None
        self.hit: str | None = None

    def __call__(self, hlo_artifacts, compiler_workdir=None, compiler_args=None, inline_weights_to_neff=True,
                 *args, **kwargs):
        self.called = True
        try:
            self.key = gk.checkpoint(self.request, lambda: self.document(
                hlo_artifacts, compiler_args, inline_weights_to_neff))
        except gk.GraphHit as hit:
            self.hit = hit.graph_key  # kept: a trace that wraps what its hook raises must not turn a hit
            raise                     # into a failure (the compiler re-raises it from here)
        return self.original(hlo_artifacts, compiler_workdir, compiler_args, inline_weights_to_neff, *args, **kwargs)

    def document(self, hlo_artifacts, compiler_args, inline_weights_to_neff) -> dict[str, Any]:
        """The canonical document the key is made of: :func:`hlo_document` (a subclass keys another one)."""
        return hlo_document(hlo_artifacts, compiler_args, inline_weights_to_neff, self.compiler_version)

    @contextlib.contextmanager
    def installed(self) -> Iterator[NeffHook]:
        """Patch ``generate_neff`` in every loaded module that holds the original (optimum-neuron's
        ``patch_everywhere``), and put them back afterwards."""
        patched = [self.module] + [m for m in list(sys.modules.values()) if m is not None and m is not self.module
                                   and getattr(m, "generate_neff", None) is self.original]
        for m in patched:
            m.generate_neff = self
        try:
            yield self
        finally:
            for m in patched:
                m.generate_neff = self.original


__all__ = ["DROPPED_FLAGS", "FALLBACK_WARNING", "REQUIRED", "XLA_TRACE_MODULE", "NeffHook", "canonical_flags",
           "canonical_hlo", "hlo_document", "split_api"]
