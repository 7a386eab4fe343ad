"""Relink instead of compile (issue 38, item 2), end to end through the CLI: a model with 2 buckets on
inductor with ``weights = "external"``; a fine-tune (new weight values only) compiles nothing, relinks
both buckets, validates, and serves the new weights; a weight that changes shape compiles; a weights
file that does not fit its package is one error line, never a crash."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

MODEL = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, seed=0, hidden=16):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(8, hidden)
        self.fc2 = nn.Linear(hidden, 4)   # fc2.bias: 4 elements, what AOTInductor inlines as literals
        self.register_buffer("scale", 1.0 + torch.rand(()))   # 0-d: inlined too without the config

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def build(seed=0, hidden=16):
    return Net(seed, hidden)
'''

CONFIG = '''
[build]
backend = "inductor"
timeout_s = 900
heartbeat_s = 5

[profiles.p1]
compiler_args = []
weights = "external"

[models.net]
factory = "ft.net:build"
kwargs = {{ seed = {seed}, hidden = {hidden} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 8] }}]
buckets = {{ batch = [1, 2] }}
'''


def _project(root: Path, seed: int, hidden: int = 16) -> Path:
    (root / "ft").mkdir(parents=True, exist_ok=True)
    (root / "ft" / "__init__.py").write_text("")
    (root / "ft" / "net.py").write_text(MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(seed=seed, hidden=hidden)))
    return cfg


def _build(cfg: Path, *targets: str, validate: bool = True) -> dict:
    def counts():
        r = run_cli("report", "--json", "-c", str(cfg))
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)
    before = counts()
    b = run_cli("build", *targets, "-c", str(cfg), timeout=1200)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    if validate:
        v = run_cli("validate", *targets, "-c", str(cfg), timeout=1200)
        assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    after = counts()
    return {k: after[k] - before[k] for k in ("compiles", "graph_reused", "failed")}


def _manifest(cfg: Path, tid: str) -> dict:
    m = json.loads(run_cli("show", tid, "--json", "-c", str(cfg)).stdout)
    return m.get("manifest", m)


@pytest.mark.slow
def test_a_fine_tune_relinks_every_bucket_and_a_shape_change_compiles(tmp_path):
    import torch

    from neuron_build.artifact import load_artifact
    from neuron_build.build.builder import Builder
    from neuron_build.errors import UserError
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    cfg = _project(tmp_path / "proj", seed=0)
    assert _build(cfg) == {"compiles": 2, "graph_reused": 0, "failed": 0}
    first = {t: _manifest(cfg, t) for t in ("net/b1/fp32/p1", "net/b2/fp32/p1")}
    assert all(m["compiler"]["weights"] == "external" for m in first.values())
    # the weights: one blob for both buckets (same model, same values)
    assert len({m["files"]["weights.safetensors"]["sha256"] for m in first.values()}) == 1

    _project(tmp_path / "proj", seed=7)                          # a fine-tune: new values, same shapes
    assert _build(cfg) == {"compiles": 0, "graph_reused": 2, "failed": 0}
    tid = "net/b2/fp32/p1"
    m = _manifest(cfg, tid)
    assert m["relinked_from"] == first[tid]["key"] and m["key"] != first[tid]["key"]
    assert m["files"]["model.pt2"] == first[tid]["files"]["model.pt2"]            # the compiled part
    assert m["files"]["weights.safetensors"] != first[tid]["files"]["weights.safetensors"]
    e = run_cli("explain", tid, "-c", str(cfg))
    assert f"weights changed, graph unchanged: relinked from {first[tid]['key']}" in e.stdout, e.stdout

    b = Builder(Workspace(load_project(cfg)))
    art = b.ws.store.artifact_dir(m["key"])
    x = torch.randn(2, 8)
    eager = _eager(tmp_path / "proj", seed=7)(x)
    got = load_artifact(art / "model.pt2", "torch._inductor.aoti_load_package", "inductor")(x)
    assert torch.allclose(got, eager, atol=1e-5)               # fc2.bias and scale come from the new weights
    assert not torch.allclose(_eager(tmp_path / "proj", seed=0)(x), eager, atol=1e-3)

    # a weights file that does not fit: one error line before anything is loaded (no segfault, no heap)
    bad = tmp_path / "bad"
    shutil.copytree(art, bad)
    from neuron_build.compilers import weights
    state = {k: v for k, v in _eager(tmp_path / "proj", seed=7, hidden=32).state_dict().items()}
    (bad / "weights.safetensors").unlink()
    weights.write(bad, state)
    shutil.copyfile(art / "weights.json", bad / "weights.json")           # the compiled part's spec
    with pytest.raises(UserError, match="fc1.bias is F32 \\[32\\] but the compiled graph expects F32 \\[16\\]"):
        load_artifact(bad / "model.pt2", "torch._inductor.aoti_load_package", "inductor")
    (bad / "weights.safetensors").unlink()
    with pytest.raises(UserError, match="cannot be read"):
        load_artifact(bad / "model.pt2", "torch._inductor.aoti_load_package", "inductor")

    _project(tmp_path / "proj", seed=7, hidden=32)               # a weight changed shape: compile
    assert _build(cfg, "net/b1/fp32/p1", validate=False) == {"compiles": 1, "graph_reused": 0, "failed": 0}
    assert _manifest(cfg, "net/b1/fp32/p1").get("relinked_from") is None


def _eager(root: Path, seed: int, hidden: int = 16):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"ft_net_{seed}_{hidden}", root / "ft" / "net.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build(seed, hidden).eval()


@pytest.mark.slow
def test_weights_that_cannot_be_kept_apart_are_said_in_the_build_and_in_explain(tmp_path):
    """A tensor attribute that is no parameter or buffer is baked into the package: the compile falls back to
    inline weights (fail closed) and says so where the user looks, not only in the worker's log."""
    cfg = _project(tmp_path / "proj", seed=0)
    model = tmp_path / "proj" / "ft" / "net.py"
    model.write_text(MODEL.replace("        self.register_buffer(\"scale\", 1.0 + torch.rand(()))",
                                   "        self.register_buffer(\"scale\", 1.0 + torch.rand(()))\n"
                                   "        self.shift = torch.full((4,), 0.5)   # a plain attribute: no buffer")
                     .replace("* self.scale", "* self.scale + self.shift"))
    b = run_cli("build", "net/b1/fp32/p1", "-c", str(cfg), timeout=1200)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    assert "weights kept inline" in b.stdout + b.stderr
    m = _manifest(cfg, "net/b1/fp32/p1")
    assert m["compiler"]["weights"] == "inline" and "weights.safetensors" not in m["files"]
    e = run_cli("explain", "net/b1/fp32/p1", "-c", str(cfg))
    assert "weights inline, not apart: " in e.stdout and "register_buffer" in e.stdout, e.stdout


@pytest.mark.slow
def test_a_graph_neutral_edit_with_external_weights_is_a_reuse_not_a_relink(tmp_path):
    """A comment added to the factory changes the key, neither the graph nor the weights: the build goes
    through the relink path (the worker stages the weights) but the weights are the same bytes, so it is a
    plain graph reuse: no ``relinked with new weights`` in the summary, ``reused`` in ``explain``, no
    ``relinked_from`` (it said "weights changed ... relinked")."""
    cfg = _project(tmp_path / "proj", seed=0)
    tid = "net/b1/fp32/p1"
    assert _build(cfg, tid, validate=False) == {"compiles": 1, "graph_reused": 0, "failed": 0}
    first = _manifest(cfg, tid)
    net = tmp_path / "proj" / "ft" / "net.py"
    net.write_text(net.read_text() + "# a comment\n")
    b = run_cli("build", tid, "-c", str(cfg), timeout=1200)
    assert b.returncode == 0 and "1 target: 0 built, 1 cached, 0 failed" in b.stdout, b.stdout + b.stderr[-2000:]
    assert "relinked" not in b.stdout, b.stdout
    m = _manifest(cfg, tid)
    assert m["key"] != first["key"] and m.get("relinked_from") is None and m["reused_from"] == first["key"]
    assert m["files"] == first["files"]
    e = run_cli("explain", tid, "-c", str(cfg))
    assert f"source changed, graph unchanged: reused {first['key']}" in e.stdout, e.stdout
