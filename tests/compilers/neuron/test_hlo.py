"""HLO instruction counting (the last op-count fallback of the neuron backend)."""

from __future__ import annotations

from pathlib import Path

from neuron_build.compilers.neuron.hlo import (
    count_hlo_instructions,
    count_proto_instructions,
    count_text_instructions,
    find_hlo,
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def instruction(name: str, opcode: str, iid: int) -> bytes:
    # HloInstructionProto: name = 1, opcode = 2, id = 35 (only the fields we need to look real)
    return _len_field(1, name.encode()) + _len_field(2, opcode.encode()) + _int_field(35, iid)


def computation(name: str, n_instr: int, cid: int) -> bytes:
    body = _len_field(1, name.encode())
    for i in range(n_instr):
        body += _len_field(2, instruction(f"{name}.{i}", "add", cid * 100 + i))
    return body + _int_field(5, cid)


def module(*comps: bytes) -> bytes:
    body = _len_field(1, b"SyncTensorsGraph.42") + _len_field(2, b"main")
    for c in comps:
        body += _len_field(3, c)
    return body + _int_field(6, 2)


def test_proto_counts_instructions_of_every_computation():
    data = module(computation("add_reducer", 3, 1), computation("main", 17, 2))
    assert count_proto_instructions(data) == 20


def test_proto_rejects_garbage_truncation_and_empty_modules():
    data = module(computation("main", 5, 1))
    assert count_proto_instructions(data[:-7]) is None          # truncated
    assert count_proto_instructions(b"\xff" * 64) is None        # not a message
    assert count_proto_instructions(module()) is None            # no computation
    assert count_proto_instructions(module(computation("empty", 0, 1))) is None
    assert count_proto_instructions(b"") is None


TEXT_HLO = """\
HloModule SyncTensorsGraph.9, entry_computation_layout={(f32[2,4]{1,0}, f32[3,4]{1,0})->(f32[2,3]{1,0})}

%max_reducer (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %maximum = f32[] maximum(f32[] %x, f32[] %y)
}

ENTRY %SyncTensorsGraph.9 (p0.1: f32[2,4], p1.2: f32[3,4]) -> (f32[2,3]) {
  %p1.2 = f32[3,4]{1,0} parameter(1), metadata={op_type="xla__device_data" op_name="xla__device_data"}
  %transpose.3 = f32[4,3]{0,1} transpose(f32[3,4]{1,0} %p1.2), dimensions={1,0}
  %p0.1 = f32[2,4]{1,0} parameter(0)
  %dot.4 = f32[2,3]{1,0} dot(f32[2,4]{1,0} %p0.1, f32[4,3]{0,1} %transpose.3), lhs_contracting_dims={1}
  ROOT %tuple.5 = (f32[2,3]{1,0}) tuple(f32[2,3]{1,0} %dot.4)
}
"""


def test_text_hlo_counts_assignment_lines_inside_computations():
    assert count_text_instructions(TEXT_HLO) == 8
    assert count_text_instructions("no module here\n%a = f32[] add()\n") is None
    assert count_text_instructions("HloModule empty\n") is None


def test_count_file_and_find_hlo(tmp_path: Path):
    wd = tmp_path / "wd"
    (wd / "model").mkdir(parents=True)
    assert find_hlo(wd) is None
    (wd / "model" / "graph.hlo").write_bytes(module(computation("main", 4, 1)))
    assert find_hlo(wd) == wd / "model" / "graph.hlo"
    assert count_hlo_instructions(wd / "model" / "graph.hlo") == 4
    (wd / "model" / "graph.hlo").write_text(TEXT_HLO)
    assert count_hlo_instructions(wd / "model" / "graph.hlo") == 8
    # the test double's HLO stand-in is neither real text HLO nor a proto: no count is made up
    (wd / "model" / "graph.hlo").write_text("# fake HLO\nHloModule graph\ninput 0 f32[2,4]\nop 0 aten::linear f32[2,3]\n")
    assert count_hlo_instructions(wd / "model" / "graph.hlo") is None
    assert count_hlo_instructions(wd / "missing.hlo") is None
    other = tmp_path / "other"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "x.hlo.pb").write_bytes(module(computation("main", 2, 1)))
    assert find_hlo(other) == other / "sub" / "x.hlo.pb"
