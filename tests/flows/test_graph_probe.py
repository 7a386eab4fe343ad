"""Issue 31, item 4: proving a graph unchanged costs one probe worker per model build
(:mod:`neuron_build.build.graph.probe`), not one compile worker per target; never for a first-level hit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.flows.test_graph_reuse import MODEL
from tests.helpers.cli import run_cli

CONFIG = '''
[build]
backend = "torchscript"
timeout_s = 900
heartbeat_s = 5

[profiles.p1]
compiler_args = []

[models.blk]
factory = "heldout.blk:build"
dtypes = [{dtypes}]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [{batches}] }}
'''


def project(root: Path, dtypes: str, batches: str, model: str = MODEL) -> Path:
    (root / "heldout").mkdir(parents=True)
    (root / "heldout" / "__init__.py").write_text("")
    (root / "heldout" / "blk.py").write_text(model)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(dtypes=dtypes, batches=batches)))
    return cfg


def probes(cfg: Path) -> list[str]:
    """The probe runs so far (one line each in the state folder's probes log)."""
    from neuron_build.build.graph import probe as graph_probe
    from neuron_build.project.config import load_project

    log = load_project(cfg).state_dir / graph_probe.PROBE_DIR / graph_probe.PROBE_LOG
    return log.read_text().splitlines() if log.exists() else []


def build_all(cfg: Path) -> tuple[object, list]:
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    return b, [b.build(t) for t in b.ws.targets]


#: MODEL whose factory reads a data file of the project (a recorded read the reuse's manifest must carry).
READING = MODEL.replace("def build():\n", "def build():\n    from pathlib import Path\n"
                        "    assert Path(__file__).with_name('width.txt').read_text().strip() == '16'\n")


def test_a_graph_neutral_edit_probes_once_per_model_build_and_compiles_nothing(tmp_path):
    """Two dtypes x two buckets: a comment in the factory is proven graph-neutral by ONE probe per model build
    (fp32 and bf16 build the model differently: two probes of two targets), no compile worker, every target
    reused with the artifact files of its first build; a no-op build starts no probe; an activation change
    probes again and compiles every target."""
    from neuron_build.store import ledger

    cfg = project(tmp_path / "proj", '"fp32", "bf16"', "1, 2", model=READING)
    (cfg.parent / "heldout" / "width.txt").write_text("16\n")
    b, first = build_all(cfg)
    assert [o.compiled for o in first] == [True] * 4 and probes(cfg) == []  # nothing in the index to prove
    files = {o.target: {n: e.sha256 for n, e in b.ws.store.manifest(o.key).files.items()} for o in first}
    src = cfg.parent / "heldout" / "blk.py"
    src.write_text("# a graph-neutral edit\n" + READING)
    b, second = build_all(cfg)
    assert [(o.status, o.compiled) for o in second] == [("PASS", False)] * 4, [o.reason for o in second]
    runs = probes(cfg)
    assert len(runs) == 2 and all("targets=2" in r and "exit=0" in r for r in runs), runs
    events = [r.event for r in ledger.read(b.ws.store)]
    assert events.count("compile") == 4 and events.count("graph-reused") == 4  # the first build's 4 only
    for o in second:
        m = b.ws.store.manifest(o.key)
        assert m.reused_from == next(f.key for f in first if f.target == o.target)
        assert {n: e.sha256 for n, e in m.files.items()} == files[o.target]
        assert "graph probe: graph key" in b.ws.store.log_file(o.key, "worker.log").read_text()
        # the probe's record of the factory's reads and imports is the compile worker's
        assert "heldout/width.txt" in json.dumps(m.recorded_inputs)
        assert m.recorded_inputs == b.ws.store.manifest(next(f.key for f in first if f.target == o.target)).recorded_inputs
    b, again = build_all(cfg)  # no-op: every first-level key hits
    assert [o.compiled for o in again] == [False] * 4 and len(probes(cfg)) == 2
    src.write_text("# a graph edit\n" + READING.replace("torch.relu(", "torch.tanh("))
    b, third = build_all(cfg)
    assert [(o.status, o.compiled) for o in third] == [("PASS", True)] * 4
    assert len(probes(cfg)) == 4
    assert all(b.ws.store.manifest(o.key).reused_from is None for o in third)


FRAGILE = MODEL.replace("def build():\n", "def build():\n    import sys\n    if '--graphs' in sys.argv:\n"
                        "        raise RuntimeError('no probe for this model')\n")


def test_a_probe_that_fails_means_its_targets_compile_after_one_probe(tmp_path):
    """A factory that fails inside the probe (and only there): one probe for the model, exit 1, then every
    target goes to its own worker, as before (which finds the graph in the index: reused, not by the probe)."""
    cfg = project(tmp_path / "proj", '"fp32"', "1, 2", model=FRAGILE)
    build_all(cfg)
    (cfg.parent / "heldout" / "blk.py").write_text("# a graph-neutral edit\n" + FRAGILE)
    b, outs = build_all(cfg)
    assert [(o.status, o.compiled) for o in outs] == [("PASS", False)] * 2, [o.reason for o in outs]
    for o in outs:
        log = b.ws.store.log_file(o.key, "worker.log").read_text()
        assert "neuron-build worker: target" in log and "graph probe:" not in log
    runs = probes(cfg)
    assert len(runs) == 1 and "targets=2" in runs[0] and "exit=1" in runs[0], runs


def test_two_processes_run_one_probe_per_model(tmp_path):
    """``build -n 2`` after a graph-neutral edit: the model's probe lock makes the second process find the
    first one's results: one probe for three targets, nothing compiled."""
    cfg = project(tmp_path / "proj", '"fp32"', "1, 2, 4")
    r = run_cli("build", "-n", "2", "-c", str(cfg), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (cfg.parent / "heldout" / "blk.py").write_text("# a graph-neutral edit\n" + MODEL)
    before = json.loads(run_cli("report", "--json", "-c", str(cfg)).stdout)
    r = run_cli("build", "-n", "2", "-c", str(cfg), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    after = json.loads(run_cli("report", "--json", "-c", str(cfg)).stdout)
    assert (after["compiles"] - before["compiles"], after["graph_reused"] - before["graph_reused"]) == (0, 3)
    runs = probes(cfg)
    assert len(runs) == 1 and "targets=3" in runs[0], runs
