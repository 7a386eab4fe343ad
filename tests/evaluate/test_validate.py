"""Validation against the eager fp32 CPU reference, end to end on small torchscript projects.

The RMSNorm project uses the shipped ``models/rmsnorm.py`` (copied into a tmp folder) at dim 64: the
eps trap, wrong weights, a too-large eps and a tampered artifact must all fail with the figures the tests
compute independently here.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.errors import ConfigError
from neuron_build.evaluate.validate import DEFAULT_TOLERANCE, is_validated, validate_target
from neuron_build.evaluate.validate_compare import compare_outputs, compare_tensors, flatten_outputs
from neuron_build.evaluate.validate_setup import validation_seed
from neuron_build.project.config import load_project
from neuron_build.release.gates import validation_gate
from neuron_build.workspace import Workspace
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, manifest_file, rewrite_manifest, write_tiny_project

DIM = 64
SMALL = "range = [-1e-3, 1e-3]"

RMS_CONFIG = f'''
[build]
backend = "torchscript"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.naive]
factory = "models.rmsnorm:naive"
kwargs = {{ dim = {DIM}, eps = 1e-6 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]

[models.naive_small]
factory = "models.rmsnorm:naive"
kwargs = {{ dim = {DIM}, eps = 1e-6 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}], {SMALL} }}]

# the eps trap: F.rms_norm left at its default eps, on small-magnitude inputs
[models.trap_small]
factory = "models.variants:fused_default_eps"
kwargs = {{ dim = {DIM} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}], {SMALL} }}]
reference = "naive_small"

# the same variant on standard-normal inputs: the trap hides
[models.trap_normal]
factory = "models.variants:fused_default_eps"
kwargs = {{ dim = {DIM} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]
reference = "naive"

# the fix: an explicit eps passes on the same small inputs
[models.fused_small]
factory = "models.rmsnorm:fused"
kwargs = {{ dim = {DIM}, eps = 1e-6 }}
dtypes = ["fp32", "bf16"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}], {SMALL} }}]
reference = "naive_small"

# broken on purpose: eps 1e-2, and other weights (seed 1)
[models.eps_big]
factory = "models.rmsnorm:fused"
kwargs = {{ dim = {DIM}, eps = 1e-2 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]
reference = "naive"

[models.wrong_weights]
factory = "models.rmsnorm:fused"
kwargs = {{ dim = {DIM}, eps = 1e-6, seed = 1 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]
reference = "naive"
'''

VARIANTS = '''
"""RMSNorm variants for the validation tests."""
from models.rmsnorm import fused


def fused_default_eps(dim: int = 512, seed: int = 0, eps=None):
    """F.rms_norm with eps left at its default (None -> torch.finfo(dtype).eps)."""
    return fused(dim, eps, seed)
'''


def write_rms_project(root: Path) -> Path:
    (root / "models").mkdir(parents=True)
    (root / "models" / "__init__.py").write_text("")
    shutil.copy(REPO / "models" / "rmsnorm.py", root / "models" / "rmsnorm.py")
    (root / "models" / "variants.py").write_text(VARIANTS)
    cfg = root / "buckets.toml"
    cfg.write_text(RMS_CONFIG)
    return cfg


@pytest.fixture(scope="module")
def rms(tmp_path_factory) -> Path:
    """The RMSNorm project with every target built (torchscript, 8 small compiles)."""
    cfg = write_rms_project(tmp_path_factory.mktemp("rms") / "proj")
    r = run_cli("build", "-c", str(cfg), "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


def _validate_json(cfg: Path, *patterns: str):
    r = run_cli("validate", "--json", "-c", str(cfg), *patterns)
    return r, {rec["target"]: rec for rec in json.loads(r.stdout)["records"]}


def _rmsnorm(x, eps, seed=0):
    """An independent RMSNorm in float64 with the shipped models' weights (1 + 0.1 N(0,1), seeded)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    w = (1.0 + 0.1 * torch.randn(x.shape[-1], generator=g)).double()
    xd = x.double()
    return xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w


def _inputs(cfg: Path, target_id: str):
    from neuron_build.examples import make_inputs
    b = Builder(Workspace(load_project(cfg)))
    key = b.ws.key(b.ws.by_id[target_id]).key
    specs = b.ws.store.manifest(key).key_details["inputs"]["inputs"]
    return key, make_inputs(specs, validation_seed(key))[0]


def _rel(a, r) -> float:
    return float((a.double() - r.double()).norm() / r.double().norm())


# --------------------------------------------------------------------------------------------------
def test_eps_trap_caught_on_small_inputs_and_named_as_cause(rms):
    import torch
    r, recs = _validate_json(rms, "trap_small", "trap_normal", "fused_small")
    assert r.returncode == 1  # trap_small fails

    # the numbers: fp32 F.rms_norm's default eps is finfo(fp32).eps, the reference's 1e-6
    key, x = _inputs(rms, "trap_small/static/fp32/p1")
    assert float(x.abs().max()) <= 1e-3
    expected = _rel(_rmsnorm(x, torch.finfo(torch.float32).eps), _rmsnorm(x, 1e-6))
    assert 0.3 < expected < 1.0  # a large, real difference, not rounding
    rec = recs["trap_small/static/fp32/p1"]
    assert rec["verdict"] == "fail" and rec["key"] == key
    out = rec["outputs"][0]
    assert out["name"] == "output0" and out["tolerance"] == 1e-4
    assert out["rel_l2_error"] == pytest.approx(expected, rel=1e-4)
    assert out["pass"] is False
    assert rec["reason"] == (f"trap_small/static/fp32/p1: output0 rel L2 error {out['rel_l2_error']:.1e} > "
                             f"tolerance 1.0e-04 (max abs error {out['max_abs_error']:.1e}, "
                             f"cosine {out['cosine_similarity']:.6f})")
    diag = "\n".join(rec["diagnosis"])
    assert "the eager fp32 model trap_small already differs from its reference naive_small" in diag
    assert "differ from naive_small's only in: eps=unset (the factory's default None) here vs 1e-06" in diag
    assert "cause: eps: with eps=1e-06 as in naive_small the error drops to" in diag
    assert "torch.finfo(dtype).eps" in diag
    assert rec["diagnosis_figures"]["kwarg_swaps"]["eps"] < 1e-6

    # the same variant on standard-normal inputs passes: only small inputs expose the trap
    key_n, xn = _inputs(rms, "trap_normal/static/fp32/p1")
    expected_n = _rel(_rmsnorm(xn, torch.finfo(torch.float32).eps), _rmsnorm(xn, 1e-6))
    assert expected_n < 1e-5
    rn = recs["trap_normal/static/fp32/p1"]
    assert rn["verdict"] == "pass"
    assert rn["outputs"][0]["rel_l2_error"] == pytest.approx(expected_n, rel=0.05, abs=2e-7)

    # an explicit eps passes on the small inputs, in fp32 and in bf16 (against the fp32 reference)
    assert recs["fused_small/static/fp32/p1"]["verdict"] == "pass"
    assert recs["fused_small/static/fp32/p1"]["outputs"][0]["rel_l2_error"] < 1e-6
    bf = recs["fused_small/static/bf16/p1"]
    assert bf["verdict"] == "pass" and bf["tolerance"] == 2e-2 and bf["tolerance_source"] == "default for bf16"
    assert 1e-4 < bf["outputs"][0]["rel_l2_error"] < 1e-2  # bf16 rounding of the output, not zero

    # the CLI's human output names the target, the output, the error, the tolerance and the cause
    h = run_cli("validate", "-c", str(rms), "trap_small")
    assert h.returncode == 1
    assert f"FAIL  trap_small/static/fp32/p1: output0 rel L2 error {out['rel_l2_error']:.1e} > tolerance 1.0e-04" in h.stdout
    assert "cause: eps" in h.stdout
    assert "1 target: 0 passed, 1 failed" in h.stdout


def test_broken_artifacts_fail_with_numbers(rms):
    r, recs = _validate_json(rms, "eps_big", "wrong_weights", "naive")
    assert r.returncode == 1

    key, x = _inputs(rms, "eps_big/static/fp32/p1")
    expected = _rel(_rmsnorm(x, 1e-2), _rmsnorm(x, 1e-6))
    assert 1e-3 < expected < 1e-2  # eps 1e-2 against mean(x^2) ~ 1: about 5e-3
    rec = recs["eps_big/static/fp32/p1"]
    o = rec["outputs"][0]
    assert rec["verdict"] == "fail"
    assert o["rel_l2_error"] == pytest.approx(expected, rel=1e-4)
    ref = _rmsnorm(x, 1e-6)
    assert o["max_abs_error"] == pytest.approx(float((_rmsnorm(x, 1e-2) - ref).abs().max()), rel=1e-3)
    assert f"eps_big/static/fp32/p1: output0 rel L2 error {o['rel_l2_error']:.1e} > tolerance 1.0e-04" in rec["reason"]
    assert any(n.startswith("cause: eps: with eps=1e-06 as in naive") for n in rec["diagnosis"])

    key, x = _inputs(rms, "wrong_weights/static/fp32/p1")
    expected = _rel(_rmsnorm(x, 1e-6, seed=1), _rmsnorm(x, 1e-6, seed=0))
    assert 0.05 < expected < 0.3  # weights 1 + 0.1 N(0,1) from another seed
    rec = recs["wrong_weights/static/fp32/p1"]
    assert rec["outputs"][0]["rel_l2_error"] == pytest.approx(expected, rel=1e-4)
    assert rec["outputs"][0]["cosine_similarity"] < 1 - 1e-3
    assert "only in: seed=1 here vs unset (the factory's default 0)" in "\n".join(rec["diagnosis"])
    assert any(n.startswith("cause: seed:") for n in rec["diagnosis"])

    assert recs["naive/static/fp32/p1"]["verdict"] == "pass"
    assert recs["naive/static/fp32/p1"]["outputs"][0]["rel_l2_error"] < 1e-6


def test_tampered_artifact_fails_and_is_blamed_on_the_artifact(tmp_path):
    """An artifact whose weights were changed after the build: the eager model matches its reference,
    so the diagnosis blames the artifact."""
    import torch
    cfg = write_rms_project(tmp_path / "p")
    assert run_cli("build", "-c", str(cfg), "naive").returncode == 0
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["naive/static/fp32/p1"]
    key = b.ws.key(t).key
    mod = torch.jit.load(str(b.ws.store.artifact_dir(key) / "model.pt"))

    class Scaled(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x) * 1.01

    # rewrite the saved module with its output scaled by 1.01: a 1e-2 relative error
    scaled = tmp_path / "scaled.pt"
    torch.jit.trace(Scaled(mod), (torch.randn(4, DIM),), check_trace=False).save(str(scaled))
    from neuron_build.util import file_sha256
    sha = file_sha256(scaled)
    b.ws.store.put_blob(sha, scaled)
    rewrite_manifest(manifest_file(b.ws.store, key), lambda m: m["files"].update(
        {"model.pt": {"size": scaled.stat().st_size, "sha256": sha}}))
    assert b.ws.store.is_complete(key)

    rec = validate_target(b.ws.project, b.ws.store, t, key)
    assert rec["verdict"] == "fail"
    o = rec["outputs"][0]
    assert o["rel_l2_error"] == pytest.approx(1e-2, rel=1e-3)
    assert o["cosine_similarity"] == pytest.approx(1.0, abs=1e-9)  # a pure scale keeps the direction
    assert rec["diagnosis"] == ["the eager fp32 model matches the reference (rel L2 error 0.0e+00): the compiled "
                                "artifact is wrong (compiler, artifact file or loader)"]
    stored = b.ws.store.result(key, "validation", "cpu")
    assert stored["verdict"] == "fail" and stored["reason"] == rec["reason"]
    assert not is_validated(b.ws.store, key, "cpu")


def test_tolerance_override_and_stored_record(tmp_path):
    cfg = write_rms_project(tmp_path / "p")
    text = cfg.read_text().replace('reference = "naive"\n\n[models.wrong_weights]',
                                   'reference = "naive"\ntolerance = { fp32 = 0.5 }\n\n[models.wrong_weights]')
    cfg.write_text(text)
    assert run_cli("build", "-c", str(cfg), "eps_big").returncode == 0
    r, recs = _validate_json(cfg, "eps_big")
    assert r.returncode == 0
    rec = recs["eps_big/static/fp32/p1"]
    assert rec["verdict"] == "pass" and rec["tolerance"] == 0.5
    assert rec["tolerance_source"] == "buckets.toml models.eps_big.tolerance.fp32"
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["eps_big/static/fp32/p1"]
    key = b.ws.key(t).key
    stored = b.ws.store.result(key, "validation", "cpu")
    # the gates.py schema
    assert stored["verdict"] == "pass" and stored["reason"] is None and stored["device_kind"] == "cpu"
    assert set(stored["outputs"][0]) >= {"name", "max_abs_error", "rel_l2_error", "cosine_similarity",
                                         "tolerance", "pass"}
    assert stored["key"] == key
    # the recorded seed is the one the figures came from: its inputs give the stored error when recomputed here
    # (an independent float64 RMSNorm, eps 1e-2 against the reference's 1e-6); the next seed's inputs do not
    from neuron_build.examples import make_inputs
    specs = b.ws.store.manifest(key).key_details["inputs"]["inputs"]
    figure = stored["outputs"][0]["rel_l2_error"]
    x = make_inputs(specs, stored["seed"])[0]
    assert figure == pytest.approx(_rel(_rmsnorm(x, 1e-2), _rmsnorm(x, 1e-6)), rel=1e-4)
    x_next = make_inputs(specs, stored["seed"] + 1)[0]
    assert figure != pytest.approx(_rel(_rmsnorm(x_next, 1e-2), _rmsnorm(x_next, 1e-6)), rel=1e-3)
    from neuron_build.evaluate.validate import reference_model_hash
    assert stored["reference"] == {"model": "naive", "factory": "models.rmsnorm:naive",
                                   "kwargs": {"dim": DIM, "eps": 1e-6}, "dtype": "fp32", "device": "cpu",
                                   "model_hash": reference_model_hash(b.ws.keys, "naive")}
    assert stored["device"] == "cpu" and stored["host"] and stored["time"]
    # results never change the key, nor the object
    assert b.ws.store.is_complete(key) and not (b.ws.store.artifact_dir(key) / "validation").exists()
    assert Workspace(load_project(cfg)).key(t).key == key
    assert is_validated(b.ws.store, key, "cpu") and is_validated(b.ws.store, key, "cpu", 0.5, "naive")
    # a pass made with another tolerance or reference than buckets.toml's now is not up to date
    assert not is_validated(b.ws.store, key, "cpu", 1e-4, "naive")
    assert not is_validated(b.ws.store, key, "cpu", 0.5, "eps_big")


def test_validation_inputs_follow_the_key_and_repeat_across_processes(rms):
    """Two keys with the same input spec validate on different inputs; a second ``validate`` (a new
    process) of the same key records the same seed and the same figures."""
    import torch

    from neuron_build.examples import make_inputs
    ids = ["naive/static/fp32/p1", "eps_big/static/fp32/p1"]
    b = Builder(Workspace(load_project(rms)))
    keys = [b.ws.key(b.ws.by_id[t]).key for t in ids]
    specs = [b.ws.store.manifest(k).key_details["inputs"]["inputs"] for k in keys]
    assert specs[0] == specs[1]  # the same shapes and dtype: only the key tells the inputs apart

    def validated() -> list[dict]:
        r, recs = _validate_json(rms, "naive", "eps_big")
        assert r.returncode == 1 and recs["eps_big/static/fp32/p1"]["verdict"] == "fail", r.stdout + r.stderr
        return [b.ws.store.result(k, "validation", "cpu") for k in keys]

    first = validated()
    assert first[0]["seed"] != first[1]["seed"]
    a, c = (make_inputs(specs[0], rec["seed"])[0] for rec in first)
    assert not torch.equal(a, c)
    again = validated()
    assert [rec["seed"] for rec in again] == [rec["seed"] for rec in first]
    assert again[1]["outputs"] == first[1]["outputs"]  # the same inputs: the same figures, to the bit


def test_not_built_is_reported(tmp_path):
    cfg = write_rms_project(tmp_path / "p")
    r = run_cli("validate", "-c", str(cfg), "naive")
    assert r.returncode == 1
    assert "NOT BUILT  naive/static/fp32/p1: run `neuron-build build naive/static/fp32/p1`" in r.stdout
    r = run_cli("validate", "-c", str(cfg), "nosuch")
    assert r.returncode == 2 and "no target matches 'nosuch'" in r.stderr


def test_neuron_artifact_without_neuroncore_is_not_validated(tmp_path, monkeypatch):
    """A neuron-backend artifact on a host without a NeuronCore: recorded as not validated, never a pass,
    and the validation gate on neuron refuses it."""
    import neuron_build.evaluate.validate as v
    cfg = write_rms_project(tmp_path / "p")
    assert run_cli("build", "-c", str(cfg), "naive").returncode == 0
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["naive/static/fp32/p1"]
    key = b.ws.key(t).key
    mf_path = manifest_file(b.ws.store, key)
    rewrite_manifest(mf_path, lambda m: m.update(backend="neuron", hardware_target="trn1"))
    monkeypatch.setattr(v, "neuron_devices", lambda: [])
    rec = validate_target(b.ws.project, b.ws.store, t, key)
    assert rec["verdict"] == "not_validated" and rec["reason"] == "no NeuronCore here"
    assert rec["device_kind"] == "neuron" and rec["outputs"] == []
    assert b.ws.store.result(key, "validation", "neuron")["verdict"] == "not_validated"
    assert b.ws.store.result(key, "validation", "cpu") is None
    assert is_validated(b.ws.store, key, "neuron")  # up to date here: repeating it cannot change it
    monkeypatch.setattr(v, "neuron_devices", lambda: ["/dev/neuron0"])
    assert not is_validated(b.ws.store, key, "neuron")  # on a host with a NeuronCore it runs again
    g = validation_gate(b.ws.store, {t.id: key}, "neuron")
    assert not g.passed and g.message == f"not validated on neuron: {t.id}"


# --------------------------------------------------------------------------------------------------
def test_reference_config_checks(tmp_path):
    cfg = write_rms_project(tmp_path / "p")
    edit(cfg, 'reference = "naive_small"\n\n# the same', 'reference = "naiv_small"\n\n# the same')
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    assert "models.trap_small.reference: unknown model 'naiv_small'; did you mean 'naive_small'?" in str(e.value)
    edit(cfg, 'reference = "naiv_small"', 'reference = "naive"')
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    msg = str(e.value)
    assert "models.trap_small.reference: model 'naive' takes other inputs (x[4, 64]) than 'trap_small' " \
           "(x[4, 64] range [-0.001, 0.001])" in msg
    edit(cfg, 'reference = "naive"\n\n# the same', 'reference = "trap_small"\n\n# the same')
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    assert "models.trap_small.reference: a model is its own reference by default" in str(e.value)
    edit(cfg, 'reference = "trap_small"\n\n# the same', 'refrence = "naive_small"\n\n# the same')
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    assert "unknown key 'refrence'; did you mean 'reference'?" in str(e.value)


def test_shipped_config_declares_the_fused_reference():
    p = load_project(REPO / "buckets.toml")
    assert p.config.models["rmsnorm_fused"].reference == "rmsnorm_naive"
    assert p.config.models["minilm"].tolerance == {"bf16": 5e-2}


def test_compare_tensors_figures():
    import torch
    r = torch.tensor([3.0, 4.0])
    m = compare_tensors(torch.tensor([3.0, 4.5]), r)
    assert m["max_abs_error"] == pytest.approx(0.5)
    assert m["rel_l2_error"] == pytest.approx(0.5 / 5.0)
    assert m["cosine_similarity"] == pytest.approx((9 + 18) / (5.0 * math.hypot(3, 4.5)))
    z = torch.zeros(3)
    assert compare_tensors(z, z)["rel_l2_error"] == 0.0 and compare_tensors(z, z)["cosine_similarity"] == 1.0
    assert compare_tensors(torch.ones(3), z)["rel_l2_error"] == math.inf
    nan = compare_tensors(torch.tensor([float("nan"), 1.0]), torch.ones(2))
    assert nan["rel_l2_error"] == math.inf and math.isnan(nan["cosine_similarity"])
    rows, problem = compare_outputs(torch.tensor([float("nan"), 1.0]), torch.ones(2), 0.5)
    assert problem is None and rows[0]["pass"] is False


def test_flatten_and_structure_mismatch():
    import torch
    a, b = torch.ones(2), torch.zeros(3)
    assert [n for n, _ in flatten_outputs(a)] == ["output0"]
    assert [n for n, _ in flatten_outputs((a, b))] == ["output0", "output1"]
    assert [n for n, _ in flatten_outputs({"last_hidden_state": a, "pooler": b, "none": None})] == [
        "last_hidden_state", "pooler"]
    assert [n for n, _ in flatten_outputs((a, (a, b)))] == ["output0", "output1.0", "output1.1"]
    rows, problem = compare_outputs((a, a), (a, b), 1e-4)
    assert problem == "output1 has shape [2], the reference [3]"
    assert len(rows) == 1 and rows[0]["pass"]
    rows, problem = compare_outputs(a, (a, b), 1e-4)
    assert problem.startswith("the artifact returns outputs ['output0'], the reference ['output0', 'output1']")


def test_default_tolerances():
    assert DEFAULT_TOLERANCE == {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}


# --------------------------------------------------------------------------------------------------
def test_doit_validate_and_torch_free_paths(tmp_path):
    """doit validate builds then validates; doit list, a no-op build and an up-to-date validate never
    import torch (checked in the doit process itself)."""
    cfg = write_tiny_project(tmp_path / "p")
    env_cfg = str(cfg)
    r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                        "validate:other/static/fp32/p1", f"config={env_cfg}"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ".  build:other/static/fp32/p1" in r.stdout and ".  validate:other/static/fp32/p1" in r.stdout
    assert "pass  other/static/fp32/p1: output0 rel L2 error" in r.stdout
    b = Builder(Workspace(load_project(cfg)))
    key = b.ws.key(b.ws.by_id["other/static/fp32/p1"]).key
    assert b.ws.store.result(key, "validation", "cpu")["verdict"] == "pass"

    probe = textwrap.dedent(f'''
        import os, sys
        os.environ["NEURON_BUILD_CONFIG"] = {env_cfg!r}
        os.chdir({str(cfg.parent)!r})
        import neuron_build.tasks as tasks
        assert "torch" not in sys.modules, "import neuron_build.tasks imported torch"
        from doit.cmd_base import ModuleTaskLoader
        from doit.doit_cmd import DoitMain
        def run(*a):
            rc = DoitMain(ModuleTaskLoader(tasks)).run(list(a))
            assert rc == 0, (a, rc)
            assert "torch" not in sys.modules, f"doit {{a}} imported torch"
        run("list", "--all")
        run("run", "--db-file", {str(tmp_path / "probe.db")!r}, "build:other/static/fp32/p1")
        run("run", "--db-file", {str(tmp_path / "probe.db")!r}, "validate:other/static/fp32/p1")
        print("TORCH-FREE")
    ''')
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "TORCH-FREE" in r.stdout
    assert "-- validate:other/static/fp32/p1" in r.stdout  # up to date: skipped

    # a failed verdict is not up to date: doit validates again (and the artifact passes)
    b.ws.store.put_result(key, "validation", "cpu", {"verdict": "fail", "reason": "x", "outputs": []})
    assert not is_validated(b.ws.store, key, "cpu")
    r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                        "validate:other/static/fp32/p1", f"config={env_cfg}"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-- build:other/static/fp32/p1" in r.stdout and ".  validate:other/static/fp32/p1" in r.stdout
    assert b.ws.store.result(key, "validation", "cpu")["verdict"] == "pass"


def test_doit_validate_failure_exits_1(rms):
    r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(rms.parent),
                        "validate:eps_big/static/fp32/p1", f"config={rms}"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1
    assert "eps_big/static/fp32/p1: output0 rel L2 error" in r.stdout + r.stderr
    assert "cause: eps" in r.stdout


def test_integer_inputs_stay_in_range_and_pass(tmp_path):
    """Token ids and a mask: int64 inputs within their ranges, the same tensors on both sides."""
    import torch

    from neuron_build.evaluate.validate_run import prepare
    cfg = write_tiny_project(tmp_path / "p", extra='''
        [models.emb]
        factory = "tinylib.emb:build"
        dtypes = ["bf16"]
        profiles = ["p1"]
        inputs = [
          { name = "ids", shape = [3, 5], dtype = "int64", range = [7, 11] },
          { name = "mask", shape = [3, 5], dtype = "int64", range = [0, 2] },
        ]
    ''')
    (cfg.parent / "tinylib" / "emb.py").write_text(textwrap.dedent('''
        import torch

        class Emb(torch.nn.Module):
            def __init__(self):
                super().__init__()
                torch.manual_seed(3)
                self.e = torch.nn.Embedding(11, 8)

            def forward(self, ids, mask):
                return self.e(ids) * mask.unsqueeze(-1).to(self.e.weight.dtype), ids

        def build():
            return Emb()
    '''))
    assert run_cli("build", "-c", str(cfg), "emb").returncode == 0
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["emb/static/bf16/p1"]
    key = b.ws.key(t).key
    p = prepare(b.ws.project, b.ws.store, t, key)
    ids, mask = p.inputs
    assert ids.dtype == torch.int64 and int(ids.min()) >= 7 and int(ids.max()) <= 10
    assert set(mask.unique().tolist()) <= {0, 1}
    assert p.reference_inputs()[0] is ids  # integer inputs are passed to the reference unchanged
    rec = validate_target(b.ws.project, b.ws.store, t, key)
    assert rec["verdict"] == "pass", rec["reason"]
    assert [o["name"] for o in rec["outputs"]] == ["output0", "output1"]
    assert rec["outputs"][1]["rel_l2_error"] == 0.0 and rec["outputs"][1]["dtype"] == "int64"
    assert 0 < rec["outputs"][0]["rel_l2_error"] < 2e-2  # bf16 weights against the fp32 reference


REF_CONFIG = f'''
[build]
backend = "torchscript"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.naive]
factory = "models.rmsnorm:naive"
kwargs = {{ dim = {DIM}, eps = 1e-6 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]

[models.fused]
factory = "models.rmsnorm:fused"
kwargs = {{ dim = {DIM}, eps = 1e-6 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [4, {DIM}] }}]
reference = "naive"
'''


def test_doit_validate_is_stale_when_the_reference_model_changes(tmp_path):
    """A pass recorded against the reference model is not up to date once the reference's content
    (here its kwargs) changes, though its name and the validated target's key stay the same."""
    cfg = write_rms_project(tmp_path / "p")
    cfg.write_text(REF_CONFIG)

    def doit_validate():
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir",
                               str(cfg.parent), "validate:fused/static/fp32/p1", f"config={cfg}"],
                              capture_output=True, text=True, timeout=600)

    r = doit_validate()
    assert r.returncode == 0, r.stdout + r.stderr
    assert ".  validate:fused/static/fp32/p1" in r.stdout
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["fused/static/fp32/p1"]
    key = b.ws.key(t).key
    stored = b.ws.store.result(key, "validation", "cpu")
    from neuron_build.evaluate.validate import reference_model_hash
    h = reference_model_hash(b.ws.keys, "naive")
    assert stored["verdict"] == "pass" and stored["reference"]["model_hash"] == h
    assert is_validated(b.ws.store, key, "cpu", 1e-4, "naive", h)
    r = doit_validate()
    assert r.returncode == 0 and "-- validate:fused/static/fp32/p1" in r.stdout, r.stdout + r.stderr

    cfg.write_text(REF_CONFIG.replace(f"dim = {DIM}, eps = 1e-6 }}\ndtypes = [\"fp32\"]\nprofiles = [\"p1\"]\n"
                                      f"inputs = [{{ name = \"x\", shape = [4, {DIM}] }}]\n\n[models.fused]",
                                      f"dim = {DIM}, eps = 1.0 }}\ndtypes = [\"fp32\"]\nprofiles = [\"p1\"]\n"
                                      f"inputs = [{{ name = \"x\", shape = [4, {DIM}] }}]\n\n[models.fused]"))
    assert 'eps = 1.0' in cfg.read_text()
    b2 = Builder(Workspace(load_project(cfg)))
    assert b2.ws.key(b2.ws.by_id["fused/static/fp32/p1"]).key == key  # the validated target's key is unchanged
    h2 = reference_model_hash(b2.ws.keys, "naive")
    assert h2 != h and not is_validated(b2.ws.store, key, "cpu", 1e-4, "naive", h2)
    r = doit_validate()
    assert r.returncode == 1, r.stdout + r.stderr
    assert ".  validate:fused/static/fp32/p1" in r.stdout
    # eps = 1.0 against 1e-6: an error of tens of percent on the key-seeded inputs (the figure moves with the key)
    err = re.search(r"FAIL  fused/static/fp32/p1: output0 rel L2 error (\S+) > tolerance 1.0e-04", r.stdout)
    assert err and 0.1 < float(err.group(1)) < 1.0, r.stdout
    stored = b2.ws.store.result(key, "validation", "cpu")
    assert stored["verdict"] == "fail" and stored["reference"]["kwargs"] == {"dim": DIM, "eps": 1.0}
    assert stored["reference"]["model_hash"] == h2
