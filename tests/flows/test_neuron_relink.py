"""Relink instead of compile on the XLA path (issue 38, item 2, ``neuron``), end to end through the CLI against the
Neuron double: a model with 2 buckets and ``inline_weights_to_neff = false``; a fine-tune (new values, same shapes)
runs neuronx-cc 0 times, relinks both buckets (the stored ``model.pt`` and NEFF plus the new weights file),
passes the validate gate (a NeuronCore pretended: the double's models run on CPU), and serves the new weights through ``torch_neuronx.replace_weights`` at load; a weight that changes
shape compiles; the inline profile compiles a fine-tune. neuronx-cc runs are counted in the double's ``calls``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.fakes.env import neuron_env
from tests.flows.test_relink import CONFIG as RELINK_CONFIG
from tests.flows.test_relink import _eager
from tests.flows.test_relink import _project as inductor_project
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

#: test_relink's project on the neuron backend, external weights in the Neuron spelling (``{inline}``: false)
CONFIG = RELINK_CONFIG.replace('backend = "inductor"', 'backend = "neuron"').replace(
    'weights = "external"', "inline_weights_to_neff = {inline}")


def _project(root: Path, seed: int, hidden: int = 16, inline: bool = False) -> Path:
    """test_relink's project (the model's package and file) with this file's neuron config."""
    cfg = inductor_project(root, seed, hidden)
    cfg.write_text(textwrap.dedent(CONFIG.format(seed=seed, hidden=hidden, inline=str(inline).lower())))
    return cfg


def calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _build(cfg: Path, env: dict, *targets: str, validate: bool = True) -> dict:
    def counts():
        r = run_cli("report", "--json", "-c", str(cfg), env=env)
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)
    before = counts()
    b = run_cli("build", *targets, "-c", str(cfg), env=env, timeout=1200)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    if validate:
        v = run_cli("validate", *targets, "-c", str(cfg), env=env, timeout=1200)
        assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    after = counts()
    return {k: after[k] - before[k] for k in ("compiles", "graph_reused", "failed")}


def _manifest(cfg: Path, env: dict, tid: str) -> dict:
    m = json.loads(run_cli("show", tid, "--json", "-c", str(cfg), env=env).stdout)
    return m.get("manifest", m)


def test_a_fine_tune_runs_neuronx_cc_zero_times_and_a_shape_change_compiles(tmp_path, monkeypatch):
    import torch

    from neuron_build.artifact import load_artifact
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace
    from tests.fakes.env import activate

    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log)
    cfg = _project(tmp_path / "proj", seed=0)
    assert _build(cfg, env) == {"compiles": 2, "graph_reused": 0, "failed": 0} and calls(log) == 2
    first = {t: _manifest(cfg, env, t) for t in ("net/b1/fp32/p1", "net/b2/fp32/p1")}
    assert all(m["compiler"]["weights"] == "external" for m in first.values())
    assert len({m["files"]["weights.safetensors"]["sha256"] for m in first.values()}) == 1  # one blob, 2 buckets
    assert set(first["net/b1/fp32/p1"]["files"]) == {"model.pt", "model.neff", "weights.json", "weights.safetensors"}

    _project(tmp_path / "proj", seed=7)                          # a fine-tune: new values, same shapes
    assert _build(cfg, env) == {"compiles": 0, "graph_reused": 2, "failed": 0}
    assert calls(log) == 2                                        # neuronx-cc ran 0 times
    tid = "net/b2/fp32/p1"
    m = _manifest(cfg, env, tid)
    assert m["relinked_from"] == first[tid]["key"] and m["key"] != first[tid]["key"]
    assert m["files"]["model.pt"] == first[tid]["files"]["model.pt"]            # the compiled part
    assert m["files"]["model.neff"] == first[tid]["files"]["model.neff"]
    assert m["files"]["weights.safetensors"] != first[tid]["files"]["weights.safetensors"]
    e = run_cli("explain", tid, "-c", str(cfg), env=env)
    assert f"weights changed, graph unchanged: relinked from {first[tid]['key']}" in e.stdout, e.stdout

    activate(monkeypatch)                                         # the double's torch_neuronx, in this process
    art = Workspace(load_project(cfg)).store.artifact_dir(m["key"])
    x = torch.randn(2, 8)
    got = load_artifact(art / "model.pt", m["compiler"]["loader"], "neuron")(x)
    assert torch.allclose(got, _eager(tmp_path / "proj", seed=7)(x), atol=1e-5)   # the new weights, at load
    assert not torch.allclose(got, _eager(tmp_path / "proj", seed=0)(x), atol=1e-3)
    # the validate gate on the relinked artifact (the double's models run on CPU: a NeuronCore is pretended)
    import neuron_build.evaluate.validate as v
    monkeypatch.setattr(v, "neuron_devices", lambda: ["/dev/neuron0"])
    b = Workspace(load_project(cfg))
    rec = v.validate_target(b.project, b.store, b.by_id[tid], m["key"], record=False)
    assert rec["verdict"] == "pass" and rec["device_kind"] == "neuron", rec

    _project(tmp_path / "proj", seed=7, hidden=32)               # a weight changed shape: compile
    assert _build(cfg, env, "net/b1/fp32/p1", validate=False) == {"compiles": 1, "graph_reused": 0, "failed": 0}
    assert calls(log) == 3 and _manifest(cfg, env, "net/b1/fp32/p1").get("relinked_from") is None


def test_the_inline_profile_compiles_a_fine_tune(tmp_path):
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log)
    cfg = _project(tmp_path / "proj", seed=0, inline=True)
    assert _build(cfg, env, "net/b1/fp32/p1", validate=False)["compiles"] == 1
    m = _manifest(cfg, env, "net/b1/fp32/p1")
    assert m["compiler"]["weights"] == "inline" and "weights.safetensors" not in m["files"]
    _project(tmp_path / "proj", seed=7, inline=True)
    assert _build(cfg, env, "net/b1/fp32/p1", validate=False) == {"compiles": 1, "graph_reused": 0, "failed": 0}
    assert calls(log) == 2
