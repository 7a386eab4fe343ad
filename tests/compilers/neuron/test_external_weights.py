"""External weights on the XLA path (issue 38, item 2, ``neuron``): the structure part of the HLO key against the
torch_neuronx double (weights by name, dtype, shape and HLO parameter, never by value), the checks that keep a
weight the HLO does not take as a parameter inline, and the double's ``replace_weights`` as the loader uses it."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.compilers.neuron.test_neuron import sdk  # noqa: F401  (the fixture)
from tests.fakes.env import activate

ARGS = ["--target", "trn1"]


@pytest.fixture
def xt(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the double's neuronx-cc writes its log into the cwd without --logfile
    activate(monkeypatch)
    from torch_neuronx.xla_impl import trace
    return trace


def _net(seed=0, hidden=16, tied=False):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.fc1 = torch.nn.Linear(8, hidden)
            self.fc2 = torch.nn.Linear(hidden, 8)
            if tied:
                self.fc3 = torch.nn.Linear(hidden, 8)
                self.fc3.weight = self.fc2.weight      # one parameter, two state-dict names
            self.register_buffer("scale", 1.0 + torch.rand(()))

        def forward(self, x):
            y = self.fc2(torch.relu(self.fc1(x)))
            if tied:
                y = y + self.fc3(torch.relu(self.fc1(x)))
            return y * self.scale
    return Net().eval()


def _lower(xt, model, inline=False):
    import torch

    return xt.generate_hlo(model, (torch.randn(2, 8),), inline_weights_to_neff=inline, cpu_backend=True)


def _structure(xt, model):
    from neuron_build.compilers.neuron import external_weights as ew
    art = _lower(xt, model)
    state = ew.model_state(model)
    assert ew.separable(art, state) is None
    return ew.structure_document(art, state, ARGS, "2.30")


def test_a_fine_tune_keeps_the_structure_and_a_shape_change_does_not(xt):
    from neuron_build.compilers.neuron import hlo_key
    base = _structure(xt, _net(0))
    assert _structure(xt, _net(7)) == base                                   # new values: one structure
    assert _structure(xt, _net(0, hidden=32)) != base                        # a weight changed shape
    assert base["weights"][0] == ["fc1.weight", "float32", [16, 8], 1]       # name, dtype, shape, HLO parameter
    assert [w[0] for w in base["weights"]] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"]
    assert base["inlined_weights"] == [] and base["external_weights"] == []  # no value anywhere
    # the inline profile keys the values (the NEFF holds them): a fine-tune is a new graph
    inline = [hlo_key.hlo_document(_lower(xt, _net(s), inline=True), ARGS, True, "2.30") for s in (0, 7)]
    assert inline[0]["inlined_weights"] != inline[1]["inlined_weights"]


def test_a_weight_the_hlo_does_not_take_as_a_parameter_stays_inline(xt):
    from neuron_build.compilers.neuron import external_weights as ew
    tied = _net(tied=True)
    assert ew.separable(_lower(xt, tied), ew.model_state(tied)) == (
        "weight fc3.weight is not a parameter of the lowered HLO module (inlined, or a second name of another "
        "weight)")
    model = _net()
    art = _lower(xt, model)
    del art.weight_name_to_idx["fc2.bias"]                                   # bound by nothing: its value is inside
    assert "fc2.bias is not a parameter" in ew.separable(art, ew.model_state(model))
    art = _lower(xt, model)
    art.weight_name_to_idx["fc2.bias"] = 99                                  # a parameter the module does not have
    assert ew.separable(art, ew.model_state(model)) == (
        "weight fc2.bias is bound to HLO parameter 99, which the entry computation does not have")
    art = _lower(xt, model, inline=True)                                     # trace inlined them: nothing separated
    assert ew.separable(art, ew.model_state(model)).startswith("generate_hlo returned no separated weights")
    art = _lower(xt, model)
    art.weights["fc1.weight"] = art.weights["fc1.weight"].to(dtype=__import__("torch").float16)
    assert ew.separable(art, ew.model_state(model)) == (
        "weight fc1.weight was lowered as float16 [16, 8] but the model holds float32 [16, 8]")


def test_the_double_replace_weights_swaps_values_and_refuses_what_it_does_not_know(xt, tmp_path):
    import torch
    import torch_neuronx

    x = torch.randn(2, 8)
    traced = torch_neuronx.trace(_net(0), x, compiler_workdir=tmp_path / "w", compiler_args=ARGS,
                                 inline_weights_to_neff=False, cpu_backend=True)
    torch.jit.save(traced, str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    assert torch_neuronx.replace_weights(loaded, _net(7).state_dict()) is None
    assert torch.allclose(loaded(x), _net(7)(x), atol=1e-6)
    with pytest.raises(RuntimeError, match="no separated weight named 'fc9.weight'"):
        torch_neuronx.replace_weights(loaded, {"fc9.weight": torch.zeros(16, 8)})
    with pytest.raises(RuntimeError, match="'fc1.weight' is torch.float32 \\[32, 8\\]"):
        torch_neuronx.replace_weights(loaded, _net(0, hidden=32).state_dict())
    assert torch.allclose(loaded(x), _net(7)(x), atol=1e-6)                  # nothing replaced by a refusal
    inline = torch_neuronx.trace(_net(0), x, compiler_workdir=tmp_path / "i", compiler_args=ARGS, cpu_backend=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_neuronx.replace_weights(inline, _net(7).state_dict())
    assert "does not contain any separated weights" in str(caught[0].message)
    assert torch.allclose(inline(x), _net(0)(x), atol=1e-6)                  # inline: the old values, silently


def test_the_loader_checks_before_it_loads_and_refuses_a_model_without_separated_weights(xt, tmp_path):
    import torch
    import torch_neuronx

    from neuron_build.artifact import load_artifact
    from neuron_build.compilers import weights
    from neuron_build.compilers.neuron import external_weights as ew
    from neuron_build.errors import UserError

    x = torch.randn(2, 8)
    for name, inline in (("ext", False), ("inl", True)):
        d = tmp_path / name
        d.mkdir()
        traced = torch_neuronx.trace(_net(0), x, compiler_workdir=d / "w", compiler_args=ARGS,
                                     inline_weights_to_neff=inline, cpu_backend=True)
        torch.jit.save(traced, str(d / "model.pt"))
        weights.write(d, ew.model_state(_net(7)))
    assert torch.allclose(load_artifact(tmp_path / "ext" / "model.pt", "", "neuron")(x), _net(7)(x), atol=1e-6)
    shared = weights.SharedWeights()                                         # a BucketedModel's: one read per file
    two = [load_artifact(tmp_path / "ext" / "model.pt", "", "neuron", shared_weights=shared) for _ in range(2)]
    assert len(shared.loaded) == 1 and all(torch.allclose(m(x), _net(7)(x), atol=1e-6) for m in two)
    with pytest.raises(UserError, match="replace_weights did not take the weights .*does not contain any separated"):
        load_artifact(tmp_path / "inl" / "model.pt", "", "neuron")
    bad = tmp_path / "ext"
    spec = (bad / weights.SPEC_FILE).read_text()
    weights.write(bad, ew.model_state(_net(7, hidden=32)))
    (bad / weights.SPEC_FILE).write_text(spec)                               # the compiled part's spec
    with pytest.raises(UserError) as e:
        load_artifact(bad / "model.pt", "", "neuron")
    assert "\n" not in str(e.value) and "fc1.bias is F32 [32] but the compiled graph expects F32 [16]" in str(e.value)


@pytest.mark.parametrize("case, inline_why", [
    ("plain", None),
    ("tied", "weight fc3.weight is not a parameter of the lowered HLO module (inlined, or a second name of another "
             "weight)"),
    ("no split API", "torch_neuronx.trace did not call generate_neff"),
    ("unreadable state dict", "the model's state_dict() cannot be read (RuntimeError: cannot read)"),
])
def test_the_compile_keeps_the_weights_apart_only_when_every_one_is_an_hlo_parameter(sdk, tmp_path, case,  # noqa: F811
                                                                                    inline_why):
    import torch

    from neuron_build.compilers import weights
    from neuron_build.compilers.neuron import NeuronCompiler
    from tests.compilers.neuron.test_neuron import request
    sdk(split="0" if case == "no split API" else None)
    req = request(tmp_path, inline_weights_to_neff=False)
    model = _net(tied=case == "tied")
    if case == "unreadable state dict":
        model.state_dict = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("cannot read"))
    details = NeuronCompiler().compile(model, (torch.randn(2, 8),), req).details
    staged = sorted(p.name for p in Path(req.out_dir).iterdir() if p.name.startswith("weights."))
    if inline_why is None:
        assert details["weights"] == "external" and staged == [weights.SPEC_FILE, weights.WEIGHTS_FILE]
        assert "replace_weights" in details["loader"] and weights.problem(req.out_dir) is None
    else:
        assert (details["weights"], details["weights_inline_why"], staged) == ("inline", inline_why, [])
