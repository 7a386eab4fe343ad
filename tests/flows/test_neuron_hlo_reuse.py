"""The XLA path split (issue 31, item 1) end to end against the Neuron double, through the CLI: the graph key is
made from the HLO module before neuronx-cc runs, so a graph-neutral edit runs neuronx-cc 0 times; what the
NEFF or model.pt depends on still compiles; a torch_neuronx without the split functions falls back with one
warning. neuronx-cc runs are counted in the double's ``calls`` file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.env import neuron_env
from tests.flows.test_graph_reuse import MODEL, NEUTRAL, held_out
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow


def calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def build(cfg: Path, env: dict) -> dict:
    """Build and validate; the ledger's counts over this build (``report --json`` before and after)."""
    def counts():
        r = run_cli("report", "--json", "-c", str(cfg), env=env)
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)
    before = counts()
    b = run_cli("build", "-c", str(cfg), env=env, timeout=1200)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    after = counts()
    v = run_cli("validate", "-c", str(cfg), env=env, timeout=1200)
    assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    return {k: after[k] - before[k] for k in ("compiles", "graph_reused")}


def worker_log(cfg: Path, env: dict, target: str) -> str:
    r = run_cli("show", target, "--json", "-c", str(cfg), env=env)
    key = json.loads(r.stdout)["key"]
    return (cfg.parent / "artifacts" / "logs" / key / "worker.log").read_text()


def test_graph_neutral_edit_runs_neuronx_cc_zero_times_and_what_the_neff_depends_on_compiles(tmp_path):
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log)
    cfg = held_out(tmp_path / "proj", "neuron", "1, 4")
    src = cfg.parent / "heldout" / "blk.py"
    assert build(cfg, env) == {"compiles": 3, "graph_reused": 0} and calls(log) == 3
    text = worker_log(cfg, env, "blk/b1/fp32/p1")
    assert 0 < text.index("graph key ") < text.index("[neuronx-cc]: Invoked as"), text  # keyed before it ran

    src.write_text(NEUTRAL)  # comments, a docstring, a renamed local, a helper: every source line moves
    assert build(cfg, env) == {"compiles": 0, "graph_reused": 2}
    assert calls(log) == 3  # neuronx-cc ran 0 times for both targets of the model
    m = json.loads(run_cli("show", "blk/b4/fp32/p1", "--json", "-c", str(cfg), env=env).stdout)
    assert m["reused_from"] and set(m["files"]) == {"model.pt", "model.neff"}

    src.write_text(NEUTRAL.replace("torch.relu(", "torch.tanh("))  # an activation change: once per target
    assert build(cfg, env) == {"compiles": 2, "graph_reused": 0} and calls(log) == 5

    src.write_text(NEUTRAL.replace("torch.relu(", "torch.tanh(").replace("manual_seed(0)", "manual_seed(3)"))
    assert build(cfg, env)["compiles"] == 2 and calls(log) == 7  # an inlined weight changed

    # a graph-neutral edit under another neuronx-cc build (same package metadata): compiles
    src.write_text(NEUTRAL.replace("torch.relu(", "torch.tanh(").replace("manual_seed(0)", "manual_seed(3)")
                   + "\n# a comment\n")
    env2 = neuron_env(calls=log, cc_version="2.31.1.0+00000000")
    assert build(cfg, env2)["compiles"] == 2 and calls(log) == 9


def test_a_changed_flag_compiles(tmp_path):
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log)
    cfg = held_out(tmp_path / "proj", "neuron", "1")
    build(cfg, env)
    assert calls(log) == 2
    cfg.write_text(cfg.read_text().replace("compiler_args = []", 'compiler_args = ["--optlevel=3"]'))
    (cfg.parent / "heldout" / "blk.py").write_text(NEUTRAL)
    assert build(cfg, env) == {"compiles": 2, "graph_reused": 0} and calls(log) == 4


def test_without_the_split_functions_the_build_falls_back_with_one_warning(tmp_path):
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log, split="0")
    cfg = held_out(tmp_path / "proj", "neuron", "1")
    assert build(cfg, env)["compiles"] == 2 and calls(log) == 2
    (cfg.parent / "heldout" / "blk.py").write_text(MODEL + "\n# a comment\n")
    assert build(cfg, env)["compiles"] == 1 and calls(log) == 3  # today's path: the edit compiles
    text = worker_log(cfg, env, "blk/b1/fp32/p1")
    warnings = [ln for ln in text.splitlines() if "has no generate_neff()" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("warning: torch_neuronx.xla_impl.trace has no"), text
