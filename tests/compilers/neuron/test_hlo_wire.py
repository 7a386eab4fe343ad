"""The HLO key on a real protobuf message whose schema lacks ``stack_frame_index`` (field 17 of
``HloModuleProto``): with ``XLA_IR_DEBUG``/``XLA_HLO_DEBUG`` set, torch-xla writes absolute paths and line
numbers there [ran: shared/weights-and-real-hlo.md 1.4]; an older ``hlo_pb2`` keeps the field as unknown
bytes, which must not reach the key.

No protobuf library is needed: ``tests/compilers/neuron/hlo_messages.py`` has a minimal protobuf message
(the wire format, a schema of field numbers, unknown fields kept and re-serialised after the known ones, as
protobuf does), and the modules are hand-made serialized ``HloModuleProto`` bytes with XLA's field numbers.
``test_hlo_real.py`` runs the same checks on real torch-xla HLO.
"""

from __future__ import annotations

import copy

import pytest

from tests.compilers.neuron.hlo_messages import NewModule, OldModule
from tests.compilers.neuron.hlo_messages import int_field as _int
from tests.compilers.neuron.hlo_messages import len_field as _len
from tests.compilers.neuron.hlo_messages import varint as _varint


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
