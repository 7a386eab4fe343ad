"""A minimal protobuf message for HLO module bytes, for the HLO key tests: no protobuf library needed.

:class:`Msg` behaves as a generated protobuf message does where :func:`canonical_hlo` touches it: fields by
name, ``ClearField``, ``copy.deepcopy``, ``SerializeToString(deterministic=...)`` (known fields in field-number
order, then the unknown fields' bytes as they were read, as protobuf keeps them). It is parsed with the
project's own wire reader (``neuron_build.compilers.neuron.hlo.wire_fields``). The schemas below carry XLA's
field numbers (``xla/service/hlo.proto``, ``xla/xla_data.proto``) for the fields the key renumbers or clears;
every other field stays unknown bytes, as an older ``hlo_pb2`` keeps it. :class:`OldModule` lacks field 17
(``stack_frame_index``), as such a schema does; :class:`NewModule` knows it.
"""

from __future__ import annotations

__all__ = ["Computation", "Instruction", "Msg", "NewModule", "OldModule", "OpMetadata", "int_field", "len_field",
           "varint"]


def varint(n: int) -> bytes:
    """The protobuf varint encoding of ``n`` (>= 0)."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def len_field(number: int, payload: bytes) -> bytes:
    """A LEN field (string, bytes, sub-message, packed repeated) with its tag."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def int_field(number: int, value: int) -> bytes:
    """A VARINT field with its tag."""
    return varint(number << 3) + varint(value)


class Msg:
    """A protobuf-like message: ``SCHEMA`` maps field number -> (name, kind); kind is "str", "bytes", "int",
    "ints" (packed repeated), a Msg subclass (singular) or [Msg subclass] (repeated)."""

    SCHEMA: dict = {}
    DESCRIPTOR = "hand-made"  # what marks a real protobuf message

    def __init__(self):
        for name, kind in self.SCHEMA.values():
            setattr(self, name, self._default(kind))
        self._unknown = b""

    @staticmethod
    def _default(kind):
        if kind == "ints" or isinstance(kind, list):
            return []
        if isinstance(kind, type):
            return kind()
        return {"str": "", "bytes": b"", "int": 0}[kind]

    @classmethod
    def parse(cls, data: bytes):
        from neuron_build.compilers.neuron.hlo import wire_fields
        m = cls()
        for number, _, value, start, stop in wire_fields(data):
            if number not in cls.SCHEMA:
                m._unknown += data[start:stop]
                continue
            name, kind = cls.SCHEMA[number]
            if kind == "str":
                setattr(m, name, value.decode())
            elif kind in ("int", "bytes"):
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
        for fname, kind in self.SCHEMA.values():
            if fname == name:
                setattr(self, name, self._default(kind))
                return
        raise ValueError(f"no field {name}")

    def SerializeToString(self, deterministic=False):
        out = b""
        for number in sorted(self.SCHEMA):
            name, kind = self.SCHEMA[number]
            v = getattr(self, name)
            if kind in ("str", "bytes") and v:
                out += len_field(number, v.encode() if kind == "str" else v)
            elif kind == "int" and v:
                out += int_field(number, v)
            elif kind == "ints" and v:
                out += len_field(number, b"".join(varint(x) for x in v))
            elif isinstance(kind, list):
                out += b"".join(len_field(number, x.SerializeToString()) for x in v)
            elif isinstance(kind, type):
                body = v.SerializeToString()
                out += len_field(number, body) if body else b""
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
    SCHEMA = {**OldModule.SCHEMA, 17: ("stack_frame_index", "bytes")}
