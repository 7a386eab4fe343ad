"""Issue 37, item 4: the graph probe is as sound as the compile worker. Each probe runs in a fresh working
folder (a factory's cwd-relative cache never carries an old graph into a later probe), and a probe result is
used only by the build that asked for it (a result left by ``build 'm/b1/*'`` is never consumed by a later
build after the environment changed)."""

from __future__ import annotations

from pathlib import Path

from tests.flows.test_graph_probe import MODEL, build_all, probes, project

#: MODEL whose activation comes from ``act.txt`` in the process's working folder, copied there from the
#: project's ``heldout/act.txt`` on first use: a cwd-relative cache.
CWD_CACHED = MODEL.replace("torch.relu(", "getattr(torch, self.act)(").replace(
    "        torch.manual_seed(0)\n", "        torch.manual_seed(0)\n        self.act = act\n").replace(
    "def __init__(self, d=16):", "def __init__(self, d=16, act='relu'):").replace(
    "def build():\n    return Block()\n",
    "def build():\n    from pathlib import Path\n    cache = Path('act.txt')\n    if not cache.exists():\n"
    "        cache.write_text(Path(__file__).with_name('act.txt').read_text())\n"
    "    return Block(act=cache.read_text().strip())\n")


def outside(path: Path) -> str:
    """MODEL whose activation is read from ``path``, a file outside the project (no recorder sees it)."""
    return MODEL.replace("torch.relu(", "getattr(torch, self.act)(").replace(
        "        torch.manual_seed(0)\n", f"        torch.manual_seed(0)\n        self.act = open({str(path)!r}).read().strip()\n")


def test_each_probe_runs_in_a_fresh_working_folder(tmp_path):
    """A graph-neutral edit is proven by a probe (which caches ``act.txt`` in its working folder); then the
    project's ``act.txt`` changes: the next probe must see the new activation (a fresh folder, as the compile
    worker gets), so the target compiles a new graph instead of reusing the relu one."""
    cfg = project(tmp_path / "proj", '"fp32"', "1", model=CWD_CACHED)
    (cfg.parent / "heldout" / "act.txt").write_text("relu\n")
    b, first = build_all(cfg)
    assert [o.compiled for o in first] == [True]
    (cfg.parent / "heldout" / "blk.py").write_text("# a graph-neutral edit\n" + CWD_CACHED)
    b, second = build_all(cfg)
    assert [(o.status, o.compiled) for o in second] == [("PASS", False)] and len(probes(cfg)) == 1
    (cfg.parent / "heldout" / "act.txt").write_text("tanh\n")
    b, third = build_all(cfg)
    assert len(probes(cfg)) == 2, probes(cfg)
    assert [(o.status, o.compiled) for o in third] == [("PASS", True)], [o.reason for o in third]
    assert b.ws.store.manifest(third[0].key).graph_key != b.ws.store.manifest(first[0].key).graph_key
    leftovers = [p.name for p in (b.ws.project.state_dir / "graph-probe").iterdir() if p.name == "act.txt"]
    assert leftovers == []


def test_a_probe_result_left_by_an_earlier_build_is_never_used(tmp_path):
    """The issue's reproduction: build both targets; a graph-neutral edit; build only b1 (its probe keys the
    whole model build and leaves b2's result); the environment changes (a file outside the project the factory
    reads: relu -> tanh); build all. b2 must compile its new graph (what NEURON_BUILD_GRAPH_PROBE=0 does: its
    own worker keys the tanh graph), never reuse the relu graph from the earlier build's result; the leftover
    result is removed."""
    ext = tmp_path / "ext" / "act.txt"
    ext.parent.mkdir()
    ext.write_text("relu\n")
    model = outside(ext)
    cfg = project(tmp_path / "proj", '"fp32"', "1, 2", model=model)
    b, first = build_all(cfg)
    assert [o.compiled for o in first] == [True, True]
    old = {o.target: b.ws.store.manifest(o.key).graph_key for o in first}
    (cfg.parent / "heldout" / "blk.py").write_text("# a graph-neutral edit\n" + model)
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    b1, b2 = b.ws.targets
    out = b.build(b1)  # `build 'blk/b1/*'`
    assert (out.status, out.compiled) == ("PASS", False)
    runs = probes(cfg)
    assert len(runs) == 1 and "targets=2" in runs[0], runs
    left = b.ws.project.state_dir / "graph-probe" / f"{b.ws.key(b2).key}.json"
    assert left.exists()  # the result b1's probe left for b2
    ext.write_text("tanh\n")
    b, third = build_all(cfg)
    got = {o.target: o for o in third}
    assert (got[b2.id].status, got[b2.id].compiled) == ("PASS", True), got[b2.id].reason
    assert b.ws.store.manifest(got[b2.id].key).graph_key != old[b2.id]
    assert b.ws.store.manifest(got[b2.id].key).reused_from is None
    assert not left.exists()
    assert len(probes(cfg)) == 2  # b2's build probed again (its own build's result)
