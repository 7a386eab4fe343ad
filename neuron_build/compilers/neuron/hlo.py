"""Count the instructions of the HLO module that ``torch_neuronx.trace`` leaves in its workdir.

The op count of a Neuron artifact comes from the compiler log when the log has one; otherwise from
``torch_neuronx.analyze`` or from this count (the manifest's ``op_count_source`` says which). Facts:

- The workdir holds the HLO as ``model/graph.hlo`` [seen: the torch-neuronx wrapper writes it there; the
  toolchain notes treat only ``graph.neff`` as certain]. It is a serialized ``HloModuleProto`` [seen].
- ``HloModuleProto.computations`` is field 3 and ``HloComputationProto.instructions`` field 2 [guess:
  field numbers of XLA's ``hlo.proto`` as published in public copies; verify on a Neuron host]. The
  count is the number of instructions over all computations, read from the protobuf wire format without
  a schema or a protobuf dependency.
- A text HLO dump (``HloModule name`` then computations of ``%name = type opcode(...)`` lines) is counted
  too: one instruction per assignment line inside a computation [doc: XLA's HLO text syntax].

Anything else (a file in another format, a truncated proto) gives None: a count is never made up.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["count_hlo_instructions", "count_proto_instructions", "count_text_instructions", "find_hlo",
           "wire_fields", "without_fields"]

MODULE_COMPUTATIONS = 3    # HloModuleProto.computations [guess, see module docstring]
COMPUTATION_INSTRUCTIONS = 2  # HloComputationProto.instructions [guess]
_WIRE_VARINT, _WIRE_I64, _WIRE_LEN, _WIRE_I32 = 0, 1, 2, 5
_TEXT_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[A-Za-z_][\w.\-]*\s*=\s*\S")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def wire_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes, int, int]]:
    """Yield ``(field number, wire type, value, start, end)`` for each top-level field of one serialized
    protobuf message, in order: LEN values are bytes, VARINT values ints, I64/I32 values their raw bytes;
    ``buf[start:end]`` is the whole field (tag included). No schema and no protobuf library needed.

    Raises:
        ValueError: the bytes are not a well-formed message (field number 0, unknown wire type,
            truncation).
    """
    pos, end = 0, len(buf)
    while pos < end:
        start = pos
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == _WIRE_VARINT:
            value, pos = _varint(buf, pos)
        elif wire in (_WIRE_I64, _WIRE_I32):
            size = 8 if wire == _WIRE_I64 else 4
            value, pos = buf[pos:pos + size], pos + size
        elif wire == _WIRE_LEN:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("truncated field")
        yield number, wire, value, start, pos


def without_fields(data: bytes, numbers: set[int] | frozenset[int]) -> bytes:
    """``data`` (one serialized protobuf message) with every top-level field whose number is in ``numbers``
    dropped, whatever the schema that wrote it (the other fields' bytes are kept as they were, in order).

    Raises:
        ValueError: the bytes are not a well-formed message.
    """
    return b"".join(data[start:stop] for number, _, _, start, stop in wire_fields(data) if number not in numbers)


def count_proto_instructions(data: bytes) -> int | None:
    """Instructions over all computations of a serialized ``HloModuleProto``; None when ``data`` is not
    one (malformed wire format, or no computation holding an instruction)."""
    try:
        total, computations = 0, 0
        for number, wire, value, _, _ in wire_fields(data):
            if number == MODULE_COMPUTATIONS and wire == _WIRE_LEN:
                computations += 1
                total += sum(1 for n, w, *_ in wire_fields(value) if n == COMPUTATION_INSTRUCTIONS and w == _WIRE_LEN)
    except ValueError:
        return None
    return total if computations and total else None


def count_text_instructions(text: str) -> int | None:
    """Instruction lines (``%x = f32[2] add(...)``, ``ROOT ...``) inside the computations of a text HLO
    module; None when the text has no ``HloModule`` header or no such line."""
    if not re.search(r"^\s*HloModule\s", text, re.M):
        return None
    depth, count = 0, 0
    for line in text.splitlines():
        stripped = line.strip()
        if depth > 0 and _TEXT_INSTR.match(line):
            count += 1
        depth += stripped.count("{") - stripped.count("}") if stripped.endswith(("{", "}")) else 0
        depth = max(depth, 0)
    return count or None


def count_hlo_instructions(path: str | Path) -> int | None:
    """Instruction count of an HLO file: text form when it decodes as UTF-8 text with an ``HloModule``
    header, else the binary ``HloModuleProto``. None when neither applies or the file cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "HloModule" in text:
        return count_text_instructions(text)
    return count_proto_instructions(data)


def find_hlo(workdir: str | Path) -> Path | None:
    """The HLO a trace left in ``workdir``: ``model/graph.hlo`` [seen], else the first ``*.hlo`` /
    ``*.hlo.pb`` / ``*.hlo_module.pb`` below it; None when there is none."""
    wd = Path(workdir)
    first = wd / "model" / "graph.hlo"
    if first.is_file():
        return first
    for pattern in ("*.hlo", "*.hlo.pb", "*.hlo_module.pb"):
        hits = sorted(wd.rglob(pattern))
        if hits:
            return hits[0]
    return None
