"""The HLO key on real torch-xla HLO: the fixtures in ``real_hlo/`` are ``HloModuleProto`` bytes lowered by
torch-xla 2.9.0 on CPU from one tiny seeded model (``benchmarks/real_hlo/generate.py`` made them and says how
to remake them; ``fixtures.json`` records each variant). The tests only parse the committed bytes, with the
project's own wire reader (``tests/compilers/neuron/hlo_messages.py``): neither torch-xla nor protobuf is needed.

Each check runs with a schema that lacks ``stack_frame_index`` (field 17, as an older ``hlo_pb2``) and with
one that knows it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from neuron_build.compilers.graph_key import NoGraphKey
from neuron_build.compilers.neuron.hlo import count_hlo_instructions, count_proto_instructions
from neuron_build.compilers.neuron.hlo_key import canonical_hlo, hlo_document
from tests.compilers.neuron.hlo_messages import NewModule, OldModule, int_field, len_field

FIXTURES = Path(__file__).parent / "real_hlo"
SCHEMAS = pytest.mark.parametrize("schema", [OldModule, NewModule], ids=["without-field-17", "with-field-17"])


def raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def key(schema, name: str) -> str:
    return hashlib.sha256(canonical_hlo(schema.parse(raw(name)))).hexdigest()


def test_the_fixtures_are_what_the_generator_recorded_and_hold_no_machine_path():
    manifest = json.loads((FIXTURES / "fixtures.json").read_text())
    assert manifest["torch_xla"] == "2.9.0" and manifest["torch"].startswith("2.9.0")
    assert sorted(p.name for p in FIXTURES.glob("*.pb")) == sorted(manifest["fixtures"])
    for name, entry in manifest["fixtures"].items():
        data = raw(name)
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"] < 16_000
        for root in (b"/tmp/", b"/home/", b"/root/", b"/usr/", b"/opt/"):
            assert root not in data, (name, root)
    # the debug fixtures differ where the key must look past them: paths, lines, per-process counters
    ref = raw("tiny_block.debug.pb")
    assert b"/src/work/checkout/tiny_model.py" in ref and b"/src/site-packages/torch/nn/modules/linear.py" in ref
    assert b"/src/work/elsewhere/moved/tiny_model.py" in raw("tiny_block.debug.moved.pb")
    for other in ("tiny_block.pb", "tiny_block.debug.moved.pb", "tiny_block.debug.comment.pb",
                  "tiny_block.debug.second.pb"):
        assert raw(other) != ref, other
    assert b"IrToHlo." in raw("tiny_block.irtohlo.pb") and b"PyLoweringContext." in raw("tiny_block.pb")
    assert b"aten__add.2/aten__add" in raw("tiny_block.debug.second.pb") and b"aten__add.2" not in ref
    # weights are HLO parameters: new values give the same bytes, debug or not
    assert raw("tiny_block.seed7.pb") == raw("tiny_block.pb")
    assert raw("tiny_block.debug.seed7.pb") == ref


@SCHEMAS
def test_debug_a_moved_folder_a_comment_edit_new_weights_and_a_second_lowering_keep_the_key(schema):
    base = key(schema, "tiny_block.pb")
    for name in ("tiny_block.debug.pb", "tiny_block.debug.moved.pb", "tiny_block.debug.comment.pb",
                 "tiny_block.seed7.pb", "tiny_block.debug.seed7.pb", "tiny_block.debug.second.pb",
                 "tiny_block.irtohlo.pb"):
        assert key(schema, name) == base, name
    canon = canonical_hlo(schema.parse(raw("tiny_block.debug.moved.pb")))
    assert b"/src/" not in canon and b"tiny_model" not in canon and b"aten__" not in canon


@SCHEMAS
def test_a_semantic_change_changes_the_key_debug_or_not(schema):
    base = key(schema, "tiny_block.pb")
    tanh = key(schema, "tiny_block.tanh.pb")
    assert tanh != base
    assert key(schema, "tiny_block.debug.tanh.pb") == tanh


def test_the_instruction_count_of_real_hlo():
    # TinyBlock: 3 computations (entry, the softmax's max and add reducers), 83 instructions [ran]; the tanh
    # GELU (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) to 7 more than the erf one
    assert count_proto_instructions(raw("tiny_block.pb")) == 83
    assert count_proto_instructions(raw("tiny_block.debug.pb")) == 83
    assert count_hlo_instructions(FIXTURES / "tiny_block.debug.moved.pb") == 83
    assert count_proto_instructions(raw("tiny_block.tanh.pb")) == 90
    m = OldModule.parse(raw("tiny_block.pb"))
    assert [len(c.instructions) for c in m.computations] == [3, 3, 77]
    ops = [i.opcode for c in m.computations for i in c.instructions]
    assert ops.count("dot") == 7 and ops.count("reduce") == 2 and ops.count("erf") == 1
    entry = m.computations[-1]
    params = sorted(i.parameter_number for i in entry.instructions if i.opcode == "parameter")
    assert params == list(range(12))  # x, the 10 weights and biases, and the scalar of "/ 4.0"
    tanh_ops = [i.opcode for c in OldModule.parse(raw("tiny_block.tanh.pb")).computations for i in c.instructions]
    assert tanh_ops.count("tanh") == 1 and "erf" not in tanh_ops and tanh_ops.count("parameter") == 16


def test_a_scalar_literal_is_an_hlo_parameter_so_the_key_holds_the_parameters_values():
    # "/ 8.0" for "/ 4.0" in forward lowers to the very same bytes: torch-xla passes the scalar as parameter 7
    # (f32[]), so the module alone cannot tell the two models apart [ran]; the key holds the values of every
    # parameter that is not an input (the inlined and the external weights, by content)
    import torch

    assert raw("tiny_block.scale8.pb") == raw("tiny_block.pb")

    def document(scale: float) -> dict:
        art = SimpleNamespace(hlo_module=OldModule.parse(raw("tiny_block.scale8.pb" if scale == 8 else "tiny_block.pb")),
                              constant_parameter_tensors={7: torch.tensor(scale)}, weights=None, metaneff=b"m",
                              flattener=None, packer=None)
        return hlo_document(art, ["--target", "trn1"], True, "2.30")

    four, eight = document(4.0), document(8.0)
    assert four["module"] == eight["module"] and four["inlined_weights"] != eight["inlined_weights"]
    assert four != eight


def _with(m, where: str, field: bytes):
    target = {"module": m, "computation": m.computations[-1], "instruction": m.computations[-1].instructions[5]}[where]
    target._unknown += field
    return m


@SCHEMAS
@pytest.mark.parametrize(("where", "field", "reason"), [
    # HloModuleProto.schedule: computation id -> instruction ids, which the canonical copy does not renumber
    ("module", len_field(7, len_field(1, int_field(1, 86) + len_field(2, len_field(1, bytes([1, 2, 3]))))), "schedule"),
    ("module", int_field(20, 1), "field 20"),                      # a field newer than the key
    ("computation", int_field(9, 1), "field 9"),
    ("instruction", len_field(4, b"p0.1"), "field 4"),             # operand_names: names, removed from XLA
    ("instruction", int_field(92, 1), "field 92"),
    ("instruction", len_field(88, len_field(1, b"p0.1")), "original_value"),
], ids=["schedule", "module-20", "computation-9", "operand-names", "instruction-92", "original-value"])
def test_a_field_the_key_does_not_understand_gives_no_key(schema, where, field, reason):
    m = _with(schema.parse(raw("tiny_block.pb")), where, field)
    with pytest.raises(NoGraphKey, match=reason):
        canonical_hlo(m)


@SCHEMAS
def test_fields_the_key_understands_are_kept_as_they_are(schema):
    base = key(schema, "tiny_block.pb")
    attrs = len_field(19, len_field(1, len_field(1, b"neff_input_names") + len_field(2, b"input0")))
    alias = len_field(8, len_field(1, int_field(2, 1)))            # input_output_alias: parameter 1 -> output {}
    for extra in (attrs, alias):
        m = _with(schema.parse(raw("tiny_block.pb")), "module", extra)
        assert hashlib.sha256(canonical_hlo(m)).hexdigest() != base


@SCHEMAS
def test_an_id_defined_twice_gives_no_key(schema):
    m = schema.parse(raw("tiny_block.pb"))
    entry = m.computations[-1]
    entry.instructions[4].id = entry.instructions[3].id
    with pytest.raises(NoGraphKey, match="twice"):
        canonical_hlo(m)
    m = schema.parse(raw("tiny_block.pb"))
    m.computations[0].id = m.computations[1].id
    with pytest.raises(NoGraphKey, match="twice"):
        canonical_hlo(m)
