"""Weights apart from the graph (neuron_build.compilers.weights): the two parts of the graph key and the
checks of a weights file before anything is loaded. No compile here (tests/build/test_relink.py compiles)."""

from __future__ import annotations

import pytest
import torch

from neuron_build.compilers import graph_key, weights


class Tiny(torch.nn.Module):
    def __init__(self, seed=0, hidden=16, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(8, hidden).to(dtype)
        self.fc2 = torch.nn.Linear(hidden, 4).to(dtype)   # fc2.bias: 4 elements, the inline-constant trap
        self.register_buffer("scale", torch.rand(()).to(dtype))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def _ep(m, dtype=torch.float32):
    return torch.export.export(m, (torch.randn(2, 8, dtype=dtype),), strict=False)


def test_structure_holds_names_shapes_dtypes_and_weights_hold_values():
    a, b = _ep(Tiny(0)), _ep(Tiny(1))
    sa, sb = weights.structure_document(a), weights.structure_document(b)
    assert sa == sb and graph_key.document_digest(sa) == graph_key.document_digest(sb)   # a fine-tune
    assert graph_key.export_document(a) != graph_key.export_document(b)                  # (the full one moves)
    wa, wb = weights.weights_document(weights.exported_state(a)), weights.weights_document(weights.exported_state(b))
    assert set(wa) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"} and wa != wb
    assert [w[0] for w in sa["weights"]] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"]
    assert sa["weights"][0] == ["fc1.weight", "float32", [16, 8]]
    assert weights.structure_document(_ep(Tiny(0, hidden=32)))["weights"] != sa["weights"]   # a shape change
    half = weights.structure_document(_ep(Tiny(0, dtype=torch.float16), torch.float16))
    assert graph_key.document_digest(half) != graph_key.document_digest(sa)                  # a dtype change


def test_a_weights_file_is_checked_against_the_spec_before_any_load(tmp_path):
    state = weights.exported_state(_ep(Tiny(0)))
    weights.write(tmp_path, state)
    assert weights.problem(tmp_path) is None
    assert weights.read_spec(tmp_path)["fc2.bias"] == {"dtype": "float32", "shape": [4]}
    other = tmp_path / "other"
    other.mkdir()
    weights.write(other, weights.exported_state(_ep(Tiny(0, hidden=32))))                 # another shape
    why = weights.problem(tmp_path, other / weights.WEIGHTS_FILE)
    assert "weight fc1.bias is F32 [32] but the compiled graph expects F32 [16]" in why
    assert "\n" not in why and str(other / weights.WEIGHTS_FILE) in why
    weights.write(other, {k: v for k, v in state.items() if k != "scale"})                 # a missing tensor
    assert "missing: scale" in weights.problem(tmp_path, other / weights.WEIGHTS_FILE)
    weights.write(other, {**state, "fc2.bias": state["fc2.bias"].double()})                # another dtype
    assert "fc2.bias is F64 [4]" in weights.problem(tmp_path, other / weights.WEIGHTS_FILE)
    (other / weights.WEIGHTS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")  # unreadable
    assert "cannot be read" in weights.problem(tmp_path, other / weights.WEIGHTS_FILE)
    assert "cannot be read" in weights.problem(tmp_path, other / "absent.safetensors")
    assert weights.problem(other / "nothing-here") is None                                # an inline artifact


def test_a_package_must_list_every_weight():
    state = dict.fromkeys(["fc1.weight", "fc1.bias", "fc2.bias"])
    assert weights.uncovered(["fc1.bias", "fc1.weight", "fc2.bias"], state) is None
    assert "inlined fc2.bias" in weights.uncovered(["fc1.weight", "fc1.bias"], state)      # the 1-D <= 8 trap
    assert "no weight: x" in weights.uncovered(["fc1.weight", "fc1.bias", "fc2.bias", "x"], state)


@pytest.mark.slow
def test_a_package_that_inlines_a_small_weight_is_compiled_with_its_weights_inline(tmp_path, monkeypatch):
    """The inline-constant trap [ran: shared/weights-and-real-hlo.md 3.4]: without
    ``always_keep_tensor_constants`` AOTInductor bakes fc2.bias (4 elements) and the 0-d scale into its
    kernels; a swap would serve wrong numbers. The compile sees it (``get_constant_fqns()`` does not list
    them) and fails closed: the package is compiled again with every weight inline, no weights file."""
    from neuron_build.compilers import inductor

    monkeypatch.setattr(weights, "AOTI_EXTERNAL_CONFIG", {"aot_inductor.package_constants_in_so": False})
    m = Tiny(3).eval()
    ep = _ep(m)
    state = weights.exported_state(ep)
    weights.write(tmp_path, state)
    why = inductor._compile(ep, tmp_path / "model.pt2", True, state)
    assert why is not None and "fc2.bias" in why and "scale" in why
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt2"]
    x = torch.randn(2, 8)
    got = torch._inductor.aoti_load_package(str(tmp_path / "model.pt2"))(x)   # runs without load_constants
    assert torch.allclose(got, m(x), atol=1e-5)


def test_weights_that_cannot_be_kept_apart_mean_an_inline_compile(tmp_path, monkeypatch, capsys):
    from neuron_build.compilers import inductor

    ep = _ep(Tiny(0))
    assert set(inductor._external_state(ep, tmp_path)) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                                          "scale"}
    assert {p.name for p in tmp_path.iterdir()} == {weights.WEIGHTS_FILE, weights.SPEC_FILE}

    def unreadable(_ep):
        raise graph_key.NoGraphKey("the value of fc1.weight is not a tensor of the exported program")
    monkeypatch.setattr(weights, "exported_state", unreadable)
    assert inductor._external_state(ep, tmp_path) is None
    assert list(tmp_path.iterdir()) == [] and "compiling with the weights inline" in capsys.readouterr().out
