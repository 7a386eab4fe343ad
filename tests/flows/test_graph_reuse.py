"""Graph reuse end to end, in a held-out project built through the CLI as a user builds it: a graph-neutral
edit compiles nothing (the ledger counts graph reuses), a graph change recompiles exactly the model's
targets, ``validate`` passes after both, ``explain`` says what happened."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.projects import twin_project, write_tiny_project

MODEL = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(d, 32)
        self.down = nn.Linear(32, d)

    def forward(self, x):
        h = torch.relu(self.up(x))
        return x + self.down(h)


def build():
    return Block()
'''

NEUTRAL = '''\
from torch import nn
import torch


def _mlp(block, inp):
    """Extracted from forward."""
    hidden = torch.relu(block.up(inp))  # a renamed local
    return block.down(hidden)


class Block(nn.Module):
    """The same block, rewritten."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(d, 32)
        self.down = nn.Linear(32, d)

    def forward(self, x):
        return x + _mlp(self, x)


def build():
    return Block()
'''

HEADER = '''
[build]
backend = "{backend}"
timeout_s = 900
heartbeat_s = 5

[profiles.p1]
compiler_args = []
'''

CONFIG = HEADER + '''
[models.blk]
factory = "heldout.blk:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [{batches}] }}

[models.keep]
factory = "heldout.keep:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [2, 16] }}]
'''


def held_out(root: Path, backend: str, batches: str) -> Path:
    (root / "heldout").mkdir(parents=True)
    (root / "heldout" / "__init__.py").write_text("")
    (root / "heldout" / "blk.py").write_text(MODEL)
    (root / "heldout" / "keep.py").write_text(
        "import torch\n\n\ndef build():\n    torch.manual_seed(1)\n    return torch.nn.Linear(16, 16)\n")
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(backend=backend, batches=batches)))
    return cfg


def build_and_count(cfg: Path) -> dict:
    """Build, then the ledger's counts over this build only (``report --json`` before and after)."""
    def counts():
        r = run_cli("report", "--json", "-c", str(cfg))
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)
    before = counts()
    b = run_cli("build", "-c", str(cfg), timeout=1200)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    after = counts()
    v = run_cli("validate", "-c", str(cfg), timeout=1200)
    assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    return {k: after[k] - before[k] for k in ("compiles", "graph_reused", "cached", "failed")}


def check_reuse(tmp_path: Path, backend: str, batches: str, n: int) -> None:
    cfg = held_out(tmp_path / "proj", backend, batches)
    assert build_and_count(cfg) == {"compiles": n + 1, "graph_reused": 0, "cached": 0, "failed": 0}
    src = cfg.parent / "heldout" / "blk.py"
    src.write_text(NEUTRAL)
    assert build_and_count(cfg)["compiles"] == 0
    r = run_cli("report", "--json", "-c", str(cfg))
    assert json.loads(r.stdout)["graph_reused"] == n
    tid = "blk/b1/fp32/p1"
    e = run_cli("explain", tid, "-c", str(cfg))
    assert e.returncode == 0 and "source changed, graph unchanged: reused " in e.stdout, e.stdout
    doc = json.loads(run_cli("explain", tid, "--json", "-c", str(cfg)).stdout)
    assert doc["graph"]["reused_from"] and doc["graph"]["reused_from"] != doc["key"]
    m = json.loads(run_cli("show", tid, "--json", "-c", str(cfg)).stdout)
    man = m.get("manifest", m)
    assert man["reused_from"] == doc["graph"]["reused_from"] and len(man["graph_key"]) == 64
    from neuron_build import __version__
    assert man["neuron_build_version"] == __version__
    src.write_text(NEUTRAL.replace("torch.relu(", "torch.tanh("))  # a graph change
    counts = build_and_count(cfg)
    assert (counts["compiles"], counts["graph_reused"]) == (n, 0)


def test_torchscript_graph_neutral_edit_compiles_nothing_and_a_graph_change_recompiles_the_model(tmp_path):
    check_reuse(tmp_path, "torchscript", "1, 4", 2)


@pytest.mark.slow
def test_inductor_graph_neutral_edit_compiles_nothing_and_a_graph_change_recompiles_the_model(tmp_path):
    check_reuse(tmp_path, "inductor", "1", 1)


def test_two_targets_with_identical_graphs_compile_once(tmp_path):
    """Two models built by the same factory (their sources and target ids differ, their graphs do not)."""

    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.store import ledger
    from neuron_build.workspace import Workspace

    cfg = twin_project(tmp_path)
    b = Builder(Workspace(load_project(cfg)))
    first, second = (b.build(b.ws.by_id[t]) for t in ("other/static/fp32/p1", "twin/static/fp32/p1"))
    assert (first.compiled, second.compiled) == (True, False) and first.key != second.key
    assert second.reason == f"graph unchanged: reused {first.key}"
    events = [(r.target, r.event) for r in ledger.read(b.ws.store)]
    assert events == [("other/static/fp32/p1", "compile"), ("twin/static/fp32/p1", "graph-reused")]
    m = b.ws.store.manifest(second.key)
    assert m.reused_from == first.key and m.graph_key == b.ws.store.manifest(first.key).graph_key
    assert {n: e.sha256 for n, e in m.files.items()} == {n: e.sha256 for n, e in b.ws.store.manifest(first.key).files.items()}


def test_an_index_entry_naming_another_models_artifact_is_refused(tmp_path):
    """Issue 29, item 6: the graph index is untrusted input. An entry for model tiny's graph that names model
    other's artifact is refused (the candidate's manifest records another graph key and document): a
    graph-neutral edit of tiny compiles, the artifact published is tiny's (its output equals the eager model's),
    and the new artifact replaces the entry."""
    import torch

    from neuron_build.build.builder import Builder
    from neuron_build.examples import build_model
    from neuron_build.project.config import load_project
    from neuron_build.store import graph_index
    from neuron_build.workspace import Workspace

    cfg = write_tiny_project(tmp_path / "proj")
    b = Builder(Workspace(load_project(cfg)))
    other = b.build(b.ws.by_id["other/static/fp32/p1"])
    tid = "tiny/b1/fp32/p1"
    first = b.build(b.ws.by_id[tid])
    assert other.compiled and first.compiled
    gk = b.ws.store.manifest(first.key).graph_key
    assert len(gk) == 64 and gk != b.ws.store.manifest(other.key).graph_key
    graph_index.record(b.ws.store, graph_index.GraphEntry(graph_key=gk, key=other.key, target=tid,
                                                          backend="torchscript"), replace=True)
    src = cfg.parent / "tinylib" / "tiny.py"
    src.write_text("# a graph-neutral edit\n" + src.read_text())
    b = Builder(Workspace(load_project(cfg)))
    out = b.build(b.ws.by_id[tid])
    assert (out.status, out.compiled) == ("PASS", True), out.reason
    m = b.ws.store.manifest(out.key)
    assert m.reused_from is None and m.graph_key == gk and len(m.graph_document) == 64
    assert graph_index.lookup(b.ws.store, gk).key == out.key  # the stale entry was replaced
    x = torch.randn(1, 16)
    compiled = torch.jit.load(str(b.ws.store.artifact_dir(out.key) / "model.pt"))
    eager = build_model(str(cfg.parent), "tinylib.tiny:build", {"width": 16}, "fp32")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x))


COND_MODEL = '''\
import torch
from torch import nn


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        h = self.lin(x)
        # the big-input branch clamps; validation's small inputs may never reach it
        return torch.cond(h.abs().amax() > 4.0, lambda t: torch.clamp(t, max=1.0), lambda t: t * 2.0, (h,))


def build():
    return Gate()
'''

COND_CONFIG = HEADER.format(backend="inductor") + '''
[models.gate]
factory = "condlib.gate:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 16] }]
'''


@pytest.mark.slow
def test_an_edit_inside_a_cond_branch_compiles_again_and_serves_the_edited_model(tmp_path):
    """Issue 29, item 1, end to end (inductor): an edit of the clamp bound inside a ``torch.cond`` branch is
    not "graph unchanged": the target compiles again and the published artifact answers a large input with
    the edited bound, as the edited eager model does."""
    import torch

    from neuron_build.build.builder import Builder
    from neuron_build.examples import build_model
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    root = tmp_path / "proj"
    (root / "condlib").mkdir(parents=True)
    (root / "condlib" / "__init__.py").write_text("")
    src = root / "condlib" / "gate.py"
    src.write_text(COND_MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(COND_CONFIG)
    b = Builder(Workspace(load_project(cfg)))
    tid = "gate/static/fp32/p1"
    first = b.build(b.ws.by_id[tid])
    assert (first.status, first.compiled) == ("PASS", True), first.reason
    src.write_text(COND_MODEL.replace("max=1.0", "max=3.0"))
    b = Builder(Workspace(load_project(cfg)))
    second = b.build(b.ws.by_id[tid])
    assert (second.status, second.compiled) == ("PASS", True), second.reason
    assert b.ws.store.manifest(second.key).reused_from is None
    assert b.ws.store.manifest(second.key).graph_key != b.ws.store.manifest(first.key).graph_key
    x = torch.full((2, 16), 10.0)  # reaches the clamp branch
    eager = build_model(str(root), "condlib.gate:build", {}, "fp32")
    served = torch._inductor.aoti_load_package(str(b.ws.store.artifact_dir(second.key) / "model.pt2"))
    with torch.no_grad():
        want = eager(x)
        assert float(want.max()) > 1.0  # the edited bound, not the old one
        torch.testing.assert_close(served(x), want)


def test_identical_graphs_built_in_parallel_compile_once(tmp_path):
    """Issue 31, item 5: two models whose factories differ only in a comment (two source keys, one graph),
    built at once with ``-n 2``: the graph key's lock makes the second wait for the first's compile and reuse
    it (one compile, both cached, the second ``reused_from`` the first)."""
    from neuron_build.project.config import load_project
    from neuron_build.store import cached_store, ledger

    cfg = twin_project(tmp_path)
    ids = ("other/static/fp32/p1", "twin/static/fp32/p1")
    b = run_cli("build", "-n", "2", "-c", str(cfg), *ids, timeout=600)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    plan = {r["target"]: r for r in json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)["targets"]}
    assert [plan[t]["state"] for t in ids] == ["cached", "cached"]
    project = load_project(cfg)
    store = cached_store(project.store_url(), project.remote_url(), project.config.build.remote_options)
    events = sorted(r.event for r in ledger.read(store) if r.target in ids)
    assert events == ["compile", "graph-reused"], events
    first, second = (r.target for r in sorted(ledger.read(store), key=lambda r: r.event) if r.target in ids)
    m1, m2 = store.manifest(plan[first]["key"]), store.manifest(plan[second]["key"])
    assert m1.reused_from is None and m2.reused_from == plan[first]["key"] != plan[second]["key"]
    assert m2.graph_key == m1.graph_key and len(m1.graph_key) == 64
    assert {n: e.sha256 for n, e in m2.files.items()} == {n: e.sha256 for n, e in m1.files.items()}
