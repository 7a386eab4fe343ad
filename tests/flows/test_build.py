"""The build end to end on a tiny project (torchscript backend: seconds per compile)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.store import Lookup
from neuron_build.workspace import Workspace
from tests.helpers.cli import REPO, compiles_in_log, run_cli
from tests.helpers.projects import edit, write_tiny_project


def plan(cfg: Path) -> dict[str, dict]:
    r = run_cli("plan", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    return {row["target"]: row for row in json.loads(r.stdout)["targets"]}


def test_build_then_noop_then_incremental(tiny):
    state = tiny.parent / ".neuron-build"
    r = run_cli("build", "-c", str(tiny), "-n", "2", "tiny/b1/*", "other")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "5 targets: 5 built, 0 cached, 0 failed" in r.stdout
    assert sorted(compiles_in_log(state)) == sorted(["tiny/b1/fp32/p1", "tiny/b1/fp32/p2", "tiny/b1/bf16/p1",
                                                     "tiny/b1/bf16/p2", "other/static/fp32/p1"])
    p = plan(tiny)
    assert {t for t, row in p.items() if row["state"] == "cached"} == {
        "tiny/b1/fp32/p1", "tiny/b1/fp32/p2", "tiny/b1/bf16/p1", "tiny/b1/bf16/p2", "other/static/fp32/p1"}

    # the manifest carries real metrics
    show = run_cli("show", "tiny/b1/bf16/p2", "--json", "-c", str(tiny))
    m = json.loads(show.stdout)
    assert m["metrics"]["status"] == "PASS"
    assert m["metrics"]["compile_time_s"] > 0
    assert m["metrics"]["op_count"] >= 3  # linear, relu, mul at least
    assert m["metrics"]["op_count_source"].startswith("torchscript-frozen-graph")
    assert m["metrics"]["peak_rss_bytes"] > 50 * 2**20
    assert m["metrics"]["artifact_bytes"] == sum(f["size"] for f in m["files"].values())
    assert set(m["files"]) == {"model.pt"} and set(m["logs"]) == {"worker.log"}  # logs are not pinned
    assert m["key_details"]["inputs"] == {"dtype": "bf16", "inputs": [
        {"name": "x", "shape": [1, 16], "dtype": "bf16", "range": None}]}
    assert m["toolchain"]["torch"].startswith("2.")

    # a second build of the same targets compiles nothing
    n = len(compiles_in_log(state))
    r = run_cli("build", "-c", str(tiny), "tiny/b1/*", "other")
    assert r.returncode == 0
    assert "0 built, 5 cached" in r.stdout
    assert len(compiles_in_log(state)) == n

    # edit one model's source: exactly that model's built targets are stale, model named first
    f = tiny.parent / "tinylib" / "other.py"
    f.write_text(f.read_text() + "# changed\n")
    p = plan(tiny)
    assert p["other/static/fp32/p1"]["state"] == "missing"
    assert p["other/static/fp32/p1"]["changed"] == ["model"]
    assert p["tiny/b1/fp32/p1"]["state"] == "cached"


def test_artifact_loads_and_computes(tiny):
    import torch
    r = run_cli("build", "-c", str(tiny), "other")
    assert r.returncode == 0, r.stderr
    b = Builder(Workspace(load_project(tiny)))
    t = b.ws.by_id["other/static/fp32/p1"]
    m = b.ws.store.manifest(b.ws.key(t).key)
    mod = torch.jit.load(str(b.ws.store.artifact_dir(m.key) / "model.pt"))
    torch.manual_seed(1)
    ref = torch.nn.Linear(16, 3)
    x = torch.randn(2, 16)
    assert torch.allclose(mod(x), ref(x), atol=1e-6)


def test_failed_compile_is_recorded_not_served_and_retried(tiny):
    edit(tiny, 'factory = "tinylib.other:build"', 'factory = "tinylib.tiny:broken"')
    r = run_cli("build", "-c", str(tiny), "other", "tiny/b1/fp32/p1")
    assert r.returncode == 1
    assert "FAILED other/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose" in r.stdout
    assert "    log: neuron-build show other/static/fp32/p1" in r.stdout
    assert "1 built" in r.stdout  # the other target still built
    b = Builder(Workspace(load_project(tiny)))
    t = b.ws.by_id["other/static/fp32/p1"]
    assert b.ws.state(t) == "failed"
    assert b.ws.store.lookup(b.ws.key(t).key) == Lookup(b.ws.key(t).key)  # absent, not damaged
    fail = b.ws.store.failure(t.id)
    assert fail.status == "ERROR" and fail.exit_code == 1
    assert b"factory exploded on purpose" in b.ws.store.failure_log(t.id).read_bytes()
    assert not list((b.ws.store.root / "staging").iterdir())
    # show prints the failure, plan says failed
    assert plan(tiny)["other/static/fp32/p1"]["state"] == "failed"
    # the next build retries it (and fails again: two compiles in the log)
    run_cli("build", "-c", str(tiny), "other")
    assert compiles_in_log(tiny.parent / ".neuron-build").count("other/static/fp32/p1") == 2


def test_timeout_and_killed(tmp_path):
    cfg = write_tiny_project(tmp_path / "p", timeout=4)
    edit(cfg, 'factory = "tinylib.other:build"', 'factory = "tinylib.tiny:slow"')
    b = Builder(Workspace(load_project(cfg)))
    t0 = time.monotonic()
    out = b.build(b.ws.by_id["other/static/fp32/p1"])
    assert out.status == "TIMEOUT"
    assert "stopped after 4 s" in out.reason
    assert time.monotonic() - t0 < 30

    edit(cfg, 'factory = "tinylib.tiny:slow"', 'factory = "tinylib.tiny:hog"')
    # the hog kills itself once torch is imported, which can take longer than 4 s on a loaded host
    edit(cfg, "timeout_s = 4\n", "timeout_s = 120\n")
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["other/static/fp32/p1"]
    out = b.build(t)
    assert out.status == "KILLED"
    assert out.reason.startswith("killed by SIGKILL (usually the kernel's out-of-memory killer); peak memory")
    assert out.metrics["exit_code"] == -signal.SIGKILL  # the worker died of signal 9, not a status of its own
    assert out.metrics["peak_rss_bytes"] > 64 * 2**20
    # the worker started and ran the factory up to its own SIGKILL: its log holds the worker's first line and
    # the line the hog prints once it has touched its 64 MiB (nothing after it: the kill is the last thing)
    fail = b.ws.store.failure(t.id)
    assert (fail.status, fail.exit_code, fail.key) == ("KILLED", -9, b.ws.key(t).key)
    log = b.ws.store.failure_log(t.id).read_text()
    assert f"neuron-build worker: target {t.id} key {b.ws.key(t).key[:12]}" in log
    hog_line = [line for line in log.splitlines() if line.startswith("hog: ")]
    assert len(hog_line) == 1 and hog_line[0].startswith(f"hog: touched {64 * 2**20} bytes in pid ")
    assert log.rstrip().endswith(hog_line[0])


def test_sigkill_of_doit_mid_compile_leaves_no_partial_object(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    edit(cfg, 'factory = "tinylib.other:build"', 'factory = "tinylib.tiny:slow"')
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                             "build:other/static/fp32/p1", f"config={cfg}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    staging = cfg.parent / "artifacts" / "staging"
    state = cfg.parent / ".neuron-build"
    worker = ["pgrep", "-f", f"neuron_build.worker {staging}"]
    deadline = time.monotonic() + 60
    running = ""
    while time.monotonic() < deadline and not running:
        time.sleep(0.1)
        running = subprocess.run(worker, capture_output=True, text=True).stdout.strip()
    # the kill lands mid-compile: a worker process runs on a request in the staging folder, and the build
    # log says the compile started (a doit that died before starting the worker would prove nothing here)
    assert running, "the compile worker never started"
    assert compiles_in_log(state) == ["other/static/fp32/p1"]
    assert any(staging.iterdir())
    time.sleep(1.0)  # the worker is inside the slow factory
    assert subprocess.run(worker, capture_output=True, text=True).stdout.strip() == running
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(0.5)
    ac = cfg.parent / "artifacts" / "ac"
    assert not ac.exists() or not any(ac.rglob("*.json"))  # nothing committed
    # the worker died with its parent (no orphan compile)
    out = subprocess.run(["pgrep", "-f", f"neuron_build.worker {staging}"], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    # the next build compiles it; the leftover staging folder is cleaned
    edit(cfg, 'factory = "tinylib.tiny:slow"', 'factory = "tinylib.other:build"')
    r = run_cli("build", "-c", str(cfg), "other")
    assert r.returncode == 0, r.stderr
    assert "1 built" in r.stdout
    assert not any(staging.iterdir())


def test_unknown_pattern_and_target_exit_2(tiny):
    r = run_cli("build", "-c", str(tiny), "nosuch/*")
    assert r.returncode == 2 and "no target matches 'nosuch/*'" in r.stderr
    r = run_cli("explain", "nope", "-c", str(tiny))
    assert r.returncode == 2 and "unknown target 'nope'" in r.stderr
    r = run_cli("show", "zz", "-c", str(tiny))
    assert r.returncode == 2 and "neither a target id nor a key" in r.stderr


def test_explain_prints_components(tiny):
    run_cli("build", "-c", str(tiny), "other")
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=3"]')
    r = run_cli("explain", "other/static/fp32/p1", "-c", str(tiny))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    comp = {ln.split()[0]: ln for ln in lines if ln.startswith("  ") and not ln.strip().startswith("-")}
    assert set(comp) == {"format", "model", "inputs", "compiler", "env", "toolchain"}
    assert "changed" in comp["compiler"] and "changed" not in comp["model"]
    assert "  - compiler: compiler_args" in lines
