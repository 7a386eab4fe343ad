"""The HLO key on a real protobuf message whose schema lacks ``stack_frame_index`` (field 17 of
``HloModuleProto``): with ``XLA_IR_DEBUG``/``XLA_HLO_DEBUG`` set, torch-xla writes absolute paths and line
numbers there [ran: shared/weights-and-real-hlo.md 1.4]; an older ``hlo_pb2`` keeps the field as unknown
bytes, which must not reach the key.

No protobuf library is needed: :class:`Msg` is a minimal protobuf message (the wire format, a schema of
field numbers, unknown fields kept and re-serialised after the known ones, as protobuf does), and the
modules are hand-made serialized ``HloModuleProto`` bytes with XLA's field numbers.
"""

from __future__ import annotations

import copy

import pytest


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


class Msg:
    """A protobuf-like message: ``SCHEMA`` maps field number -> (name, kind); kind is "str", "int",
    "ints" (packed repeated), a Msg subclass (singular) or [Msg subclass] (repeated)."""

    SCHEMA: dict = {}
    DESCRIPTOR = "hand-made"  # what marks a real protobuf message

    def __init__(self):
        for name, kind in self.SCHEMA.values():
            setattr(self, name, [] if kind == "ints" or isinstance(kind, list) else
                    (kind() if isinstance(kind, type) else ("" if kind == "str" else 0)))
        self._unknown = b""

    @classmethod
    def parse(cls, data: bytes):
        from neuron_build.compilers.neuron.hlo import _fields
        m = cls()
        for number, wire, value in _fields(data):
            if number not in cls.SCHEMA:
                m._unknown += (_len(number, value) if wire == 2 else _int(number, value))
                continue
            name, kind = cls.SCHEMA[number]
            if kind == "str":
                setattr(m, name, value.decode())
            elif kind == "int":
                setattr(m, name, value)
            elif kind == "ints":
                getattr(m, name).extend(Msg._unpack(value))
            elif isinstance(kind, list):
                getattr(m, name).append(kind[0].parse(value))
            else:
                setattr(m, name, kind.parse(value))
        return m

    @staticmethod
    def _unpack(buf: bytes) -> list:
        from neuron_build.compilers.neuron.hlo import _varint as rd
        out, pos = [], 0
        while pos < len(buf):
            v, pos = rd(buf, pos)
            out.append(v)
        return out

    def ClearField(self, name):  # (protobuf's name)
        for fname, _ in self.SCHEMA.values():
            if fname == name:
                setattr(self, name, type(self)().__dict__[name])
                return
        raise ValueError(f"no field {name}")

    def SerializeToString(self, deterministic=False):
        out = b""
        for number in sorted(self.SCHEMA):
            name, kind = self.SCHEMA[number]
            v = getattr(self, name)
            if kind == "str" and v:
                out += _len(number, v.encode())
            elif kind == "int" and v:
                out += _int(number, v)
            elif kind == "ints" and v:
                out += _len(number, b"".join(_varint(x) for x in v))
            elif isinstance(kind, list):
                out += b"".join(_len(number, x.SerializeToString()) for x in v)
            elif isinstance(kind, type):
                body = v.SerializeToString()
                out += _len(number, body) if body else b""
        return out + self._unknown


class OpMetadata(Msg):
    SCHEMA = {1: ("op_type", "str"), 2: ("op_name", "str"), 3: ("source_file", "str"), 4: ("source_line", "int")}


class Instruction(Msg):
    SCHEMA = {1: ("name", "str"), 2: ("opcode", "str"), 7: ("metadata", OpMetadata), 9: ("parameter_number", "int"),
              35: ("id", "int"), 36: ("operand_ids", "ints"), 37: ("control_predecessor_ids", "ints"),
              38: ("called_computation_ids", "ints")}


class Computation(Msg):
    SCHEMA = {1: ("name", "str"), 2: ("instructions", [Instruction]), 5: ("id", "int"), 6: ("root_id", "int")}


class OldModule(Msg):
    """``HloModuleProto`` as an older schema knows it: no field 17 (``stack_frame_index``)."""
    SCHEMA = {1: ("name", "str"), 2: ("entry_computation_name", "str"), 3: ("computations", [Computation]),
              5: ("id", "int"), 6: ("entry_computation_id", "int")}


class NewModule(OldModule):
    SCHEMA = {**OldModule.SCHEMA, 17: ("stack_frame_index", "str")}


def _instruction(iid, name, opcode, operands=(), path="", line=0) -> bytes:
    meta = _len(1, opcode.encode()) + _len(2, f"aten__{opcode}.{iid}".encode())
    if path:
        meta += _len(3, path.encode()) + _int(4, line)
    body = _len(1, name.encode()) + _len(2, opcode.encode()) + _len(7, meta) + _int(35, iid)
    if operands:
        body += _len(36, b"".join(_varint(o) for o in operands))
    return body


def module_bytes(root="/home/alice/proj", line=10, op="tanh", debug=True, start=7) -> bytes:
    """A serialized ``HloModuleProto``: p0 -> <op> -> add(p0, <op>); with ``debug``, the paths and lines of
    ``root``/model.py in every instruction's metadata and in the module's ``stack_frame_index``."""
    p = f"{root}/model.py" if debug else ""
    inst = [_instruction(start, f"p0.{start}", "parameter", path=p, line=line),
            _instruction(start + 1, f"{op}.{start + 1}", op, [start], p, line + 1),
            _instruction(start + 2, f"add.{start + 2}", "add", [start, start + 1], p, line + 2)]
    comp = _len(1, f"IrToHlo.{start + 2}".encode()) + b"".join(_len(2, i) for i in inst) + _int(5, 1) + \
        _int(6, start + 2)
    data = _len(1, f"IrToHlo.{start + 2}".encode()) + _len(2, f"IrToHlo.{start + 2}".encode()) + _len(3, comp) + \
        _int(5, 1) + _int(6, 1)
    if debug:  # StackFrameIndexProto: file_names (1), function_names (2), file_locations (3)
        frames = _len(1, p.encode()) + _len(1, f"{root}/venv/torch/nn/modules/module.py".encode()) + \
            _len(2, b"forward") + _len(3, _int(1, 1) + _int(2, 1) + _int(3, line))
        data += _len(17, frames)
    return data


def _key(schema, data: bytes) -> bytes:
    from neuron_build.compilers.neuron.hlo_key import canonical_hlo
    return canonical_hlo(schema.parse(data))


@pytest.mark.parametrize("schema", [OldModule, NewModule], ids=["schema-without-field-17", "schema-with-field-17"])
def test_the_checkout_path_and_lines_never_reach_the_hlo_key(schema):
    base = _key(schema, module_bytes())
    assert schema.parse(module_bytes()).SerializeToString() == module_bytes()   # the message round-trips
    assert _key(schema, module_bytes(root="/srv/ci/checkout-2")) == base           # a moved folder
    assert _key(schema, module_bytes(line=42)) == base                             # a comment edit shifts lines
    assert _key(schema, module_bytes(debug=False)) == base                         # debug on == debug off
    assert _key(schema, module_bytes(start=1234)) == base                          # ids in lowering order
    assert _key(schema, module_bytes(op="sigmoid")) != base                        # a semantic change
    assert b"/home/alice" not in base and b"model.py" not in base


def test_the_canonical_copy_leaves_the_message_alone_and_fails_closed_on_a_broken_tail():
    from neuron_build.compilers import graph_key
    from neuron_build.compilers.neuron.hlo_key import canonical_hlo
    m = OldModule.parse(module_bytes())
    before = m.SerializeToString()
    canonical_hlo(m)
    assert m.SerializeToString() == before and b"/home/alice" in m._unknown
    m._unknown += b"\x8a\x01\xff"                  # field 17, LEN, a length running past the end
    with pytest.raises(graph_key.NoGraphKey, match="wire"):
        canonical_hlo(m)
    assert copy.deepcopy(m)._unknown == m._unknown
