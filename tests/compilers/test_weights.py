"""Weights apart from the graph (neuron_build.compilers.weights): the two parts of the graph key and the
checks of a weights file before anything is loaded. No compile here (tests/flows/test_relink.py compiles)."""

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


def test_a_spec_of_several_files_checks_each_under_a_root_and_names_none_outside(tmp_path):
    """NxDI's shards: one spec names every weights file (relative paths); problem() checks each one under the
    staged root; a path outside the folder or a one-file reader of it is refused in one line."""
    import json

    from safetensors.torch import save_file

    (tmp_path / "weights").mkdir()
    for r in range(2):
        save_file({"w": torch.zeros(2, 3), "rank": torch.arange(2, dtype=torch.int32)},
                  str(tmp_path / "weights" / f"tp{r}.safetensors"))
    weights.write_files_spec(tmp_path, ["weights/tp1.safetensors", "weights/tp0.safetensors"])
    specs = weights.read_specs(tmp_path)
    assert list(specs) == ["weights/tp0.safetensors", "weights/tp1.safetensors"]
    assert specs["weights/tp0.safetensors"] == {"rank": {"dtype": "int32", "shape": [2]},
                                                "w": {"dtype": "float32", "shape": [2, 3]}}
    assert weights.problem(tmp_path) is None
    staged = tmp_path / "staged"
    (staged / "weights").mkdir(parents=True)
    save_file({"w": torch.zeros(2, 3), "rank": torch.arange(2, dtype=torch.int32)}, str(staged / "weights/tp0.safetensors"))
    save_file({"w": torch.zeros(2, 4), "rank": torch.arange(2, dtype=torch.int32)}, str(staged / "weights/tp1.safetensors"))
    assert weights.problem(tmp_path, root=staged) == (
        f"{staged / 'weights/tp1.safetensors'}: weight w is F32 [2, 4] but the compiled graph expects F32 [2, 3]; "
        "rebuild the artifact or pull the release again")
    with pytest.raises(ValueError, match="names 2 weights files"):
        weights.read_spec(tmp_path)
    raw = json.loads((tmp_path / weights.SPEC_FILE).read_text())
    raw["files"]["../outside.safetensors"] = {}
    (tmp_path / weights.SPEC_FILE).write_text(json.dumps(raw))
    assert weights.problem(tmp_path).startswith(f"{tmp_path / weights.SPEC_FILE} is not a weights spec")


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


class _Package:
    """What :func:`weights.load_into` needs of an AOTInductor package: its constants' names, and a record of
    what ``load_constants`` was handed (nothing real is loaded: no compile in this file)."""

    def __init__(self, fqns):
        self.fqns, self.calls = list(fqns), []

    def get_constant_fqns(self):
        return self.fqns

    def load_constants(self, state, *, check_full_update, user_managed=False):
        self.calls.append((state, check_full_update, user_managed))


def test_shared_weights_are_loaded_once_and_handed_to_every_package_uncopied(tmp_path):
    import os

    state = weights.exported_state(_ep(Tiny(0)))
    a, b, c = (tmp_path / n for n in ("b1", "b2", "b3"))
    for d in (a, b, c):
        d.mkdir()
    weights.write(a, state)
    for d in (b, c):
        (d / weights.SPEC_FILE).write_bytes((a / weights.SPEC_FILE).read_bytes())
    os.link(a / weights.WEIGHTS_FILE, b / weights.WEIGHTS_FILE)                       # a pulled release's hard link
    (c / weights.WEIGHTS_FILE).write_bytes((a / weights.WEIGHTS_FILE).read_bytes())   # a copy: known by its digest
    shared = weights.SharedWeights({str((c / weights.WEIGHTS_FILE).resolve()): "sha-of-c"})
    pkgs = [_Package(state) for _ in range(3)]
    for p, d in zip(pkgs, (a, b, c), strict=True):
        weights.load_into(p, d, state=shared.get(d))
    assert len(shared.loaded) == 2                      # a and b: one inode; c: another content identity
    assert shared.nbytes() == 2 * sum(t.numel() * 4 for t in state.values())
    (sa, full_a, um_a), (sb, _, um_b) = pkgs[0].calls[0], pkgs[1].calls[0]
    assert sa is sb and full_a and um_a and um_b         # the same tensors, user-managed: never copied
    assert all(sa[k].data_ptr() == sb[k].data_ptr() for k in state)
    assert all(torch.equal(sa[k], state[k]) for k in state)
    one = weights.SharedWeights({str((d / weights.WEIGHTS_FILE).resolve()): "d" for d in (a, c)})
    assert one.get(a) is one.get(c)                      # two files, one listed digest: loaded once


def test_shared_weights_that_do_not_fit_a_package_are_refused_before_it_gets_them(tmp_path):
    from neuron_build.errors import UserError

    state = weights.exported_state(_ep(Tiny(0)))
    weights.write(tmp_path, state)
    shared = weights.SharedWeights()
    pkg = _Package(state)
    wide = {**state, "fc1.bias": torch.zeros(32)}          # the heap-corruption case: a wrong shape
    with pytest.raises(UserError, match=r"weight fc1.bias is float32 \[32\] but the compiled graph expects "
                                        r"float32 \[16\]; rebuild the artifact"):
        weights.load_into(pkg, tmp_path, "bucket b1: ", state=wide)
    with pytest.raises(UserError, match="missing: scale"):
        weights.load_into(pkg, tmp_path, state={k: v for k, v in state.items() if k != "scale"})
    with pytest.raises(UserError, match="inlined fc2.bias"):   # a package that baked a weight in
        weights.load_into(_Package([k for k in state if k != "fc2.bias"]), tmp_path, state=shared.get(tmp_path))
    assert pkg.calls == []
    (tmp_path / weights.WEIGHTS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(UserError, match="cannot be read") as e:
        weights.SharedWeights().get(tmp_path, "bucket b2: ")
    assert str(e.value).startswith("bucket b2: ") and "\n" not in str(e.value)
    (tmp_path / weights.WEIGHTS_FILE).unlink()
    with pytest.raises(UserError, match="cannot be read"):
        weights.SharedWeights().get(tmp_path)
