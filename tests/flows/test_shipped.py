"""The shipped matrix, built as the README says, in a copy of the checkout (slow: real compiles)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, compiles_in_log, run_cli
from tests.helpers.projects import checkout_copy


def doit(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1500)


@pytest.mark.slow
def test_shipped_matrix_builds_and_stays_built(tmp_path):
    a = checkout_copy(tmp_path / "a")
    r = doit(a, "build")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ls = run_cli("ls", "--json", "-c", str(a / "buckets.toml"))
    rows = json.loads(ls.stdout)["artifacts"]
    plan = json.loads(run_cli("plan", "--json", "-c", str(a / "buckets.toml")).stdout)["targets"]
    assert len(rows) == len(plan) == 10
    assert {r["target"] for r in rows} == {p["target"] for p in plan}
    for row in rows:
        m = json.loads(run_cli("show", row["key"], "--json", "-c", str(a / "buckets.toml")).stdout)
        assert m["metrics"]["status"] == "PASS"
        assert m["metrics"]["compile_time_s"] > 0
        assert m["metrics"]["op_count"] > 0, m["target"]
        assert m["metrics"]["op_count_source"]
        assert m["metrics"]["peak_rss_bytes"] > 0
        assert "model.pt2" in m["files"]
    minilm = [r for r in rows if r["target"].startswith("minilm/")]
    assert len(minilm) == 6 and all(r["artifact_bytes"] > 40 * 2**20 for r in minilm)  # real weights inside

    compiled = len(compiles_in_log(a / ".neuron-build"))
    assert compiled == 10
    # a second build compiles nothing
    r = doit(a, "build")
    assert r.returncode == 0
    assert ".  build:" not in r.stdout and r.stdout.count("-- build:") == 10
    # a moved checkout without its doit database rebuilds nothing
    b = tmp_path / "moved" / "b"
    b.parent.mkdir()
    shutil.move(str(a), str(b))
    for db in b.glob(".doit.db*"):
        db.unlink()
    r = doit(b, "build")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("-- build:") == 10
    assert len(compiles_in_log(b / ".neuron-build")) == compiled
    plan = json.loads(run_cli("plan", "--json", "-c", str(b / "buckets.toml")).stdout)["targets"]
    assert {p["state"] for p in plan} == {"cached"}
