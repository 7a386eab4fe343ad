"""The registry as a release manager sees it, after a scripted release flow through the CLI: ``releases diff``
(text and JSON), the registry section of ``report --html`` rendered in headless chromium, and ``report --json``'s
registry figures.

The flow (module fixture, one tiny project, real builds, validations and benchmarks): release r1 (b1, b4),
promote it dev -> staging; edit a model source and add bucket 8, release r2 (b1, b4, b8), promote it into dev;
a refused promotion of r2 straight into prod; r2 dev -> staging; roll staging back to r1; finally drop bucket 8
from the matrix, so r2's b8 is a target no longer in the matrix.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli, write_tiny_project
from test_config import edit

ACTOR = "release-manager@ci"
RELEASE = "\n[release]\nmax_latency_ratio = 100\n"


def cli(cfg: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    r = run_cli(*args, "-c", str(cfg), env={"NEURON_BUILD_ACTOR": ACTOR})
    assert r.returncode in ok, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def flow(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("registry") / "proj"
    cfg = write_tiny_project(root, extra=RELEASE)
    sel = "tiny/*/fp32/p1"
    cli(cfg, "build", "-n", "2", sel)
    cli(cfg, "validate", sel)
    cli(cfg, "bench", sel, "--max-time", "5")
    r1 = cli(cfg, "release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q").stdout.strip()
    cli(cfg, "promote", "tiny", r1, "--to", "dev")
    cli(cfg, "promote", "tiny", "--from", "dev", "--to", "staging")
    (root / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 3\n")
    edit(cfg, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 4, 8] }")
    cli(cfg, "build", "-n", "2", sel)
    cli(cfg, "validate", sel)
    cli(cfg, "bench", sel, "--max-time", "5")
    r2 = cli(cfg, "release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q").stdout.strip()
    cli(cfg, "promote", "tiny", r2, "--to", "dev")
    refused = cli(cfg, "promote", "tiny", r2, "--to", "prod", ok=(3,))
    cli(cfg, "promote", "tiny", "--from", "dev", "--to", "staging")
    cli(cfg, "rollback", "tiny", "--channel", "staging", "--reason", "p99 regression on canary")
    edit(cfg, "buckets = { batch = [1, 4, 8] }", "buckets = { batch = [1, 4] }")
    return {"cfg": cfg, "r1": r1, "r2": r2, "refused": refused.stderr}


def test_releases_diff_names_changed_buckets_and_key_components(flow):
    cfg, r1, r2 = flow["cfg"], flow["r1"], flow["r2"]
    doc = json.loads(cli(cfg, "releases", "diff", r1, "tiny@dev", "--json").stdout)
    assert doc["schema"] == "neuron-build/releases-diff/v1"
    assert (doc["a"]["id"], doc["b"]["id"]) == (r1, r2)
    assert (doc["changed"], doc["same"], doc["added"], doc["removed"]) == (["b1", "b4"], [], ["b8"], [])
    by = {b["bucket_id"]: b for b in doc["buckets"]}
    assert by["b1"]["key"] == {"same": False, "components": ["model: sources.tinylib/act.py"]}
    assert by["b8"]["state"] == "added" and by["b8"]["a"] is None and by["b8"]["key"] is None
    for bid in ("b1", "b4"):
        for side in ("a", "b"):
            s = by[bid][side]
            assert s["validation"] == {"cpu": {"verdict": "pass", "error": None}}
            assert s["op_count"] > 0 and s["compile_time_s"] > 0 and s["artifact_bytes"] > 0
            (bench,) = s["bench"].values()
            assert 0 < bench["p50_ms"] <= bench["p99_ms"]
    assert doc["toolchain"]["same"] is True and "torch" in doc["a"]["toolchain"]
    # the gate verdicts of every promotion and refusal of each release, oldest first
    assert [(g["channel"], g["action"]) for g in doc["a"]["gates"]] == [("dev", "promote"), ("staging", "promote")]
    assert [(g["channel"], g["action"]) for g in doc["b"]["gates"]] == [
        ("dev", "promote"), ("staging", "promote"), ("prod", "refuse")]
    prod = doc["b"]["gates"][2]["gates"]
    assert {g["name"]: g["verdict"] for g in prod}["channel_order"] == "fail"
    assert doc["a"]["channels"] == ["staging"] and doc["b"]["channels"] == ["dev"]

    # the same diff by prefix and as text
    text = cli(cfg, "releases", "diff", r1[:10], r2).stdout
    assert f"--- {r1}" in text and f"+++ {r2}" in text
    assert "~ b1: key changed" in text and "model: sources.tinylib/act.py" in text
    assert "+ b8: added (tiny/b8/fp32/p1" in text and "2 changed, 0 same, 1 added, 0 removed" in text
    same = json.loads(cli(cfg, "releases", "diff", "tiny@staging", r1, "--json").stdout)
    assert same["same"] == ["b1", "b4"] and same["changed"] == []
    # bad references: one line naming the reference
    r = cli(cfg, "releases", "diff", r1, "tiny@prod", ok=(2,))
    assert "tiny@prod: channel 'prod' of model 'tiny' holds no release" in r.stderr and "Traceback" not in r.stderr
    r = cli(cfg, "releases", "diff", r1, ok=(2,))
    assert "releases diff needs two releases (got 1)" in r.stderr
    r = cli(cfg, "releases", "diff", "r-00000000", r1, ok=(2,))
    assert "no release 'r-00000000'" in r.stderr
    # listing still works
    assert [x["id"] for x in json.loads(cli(cfg, "releases", "tiny", "--json").stdout)["releases"]] == [r1, r2]
