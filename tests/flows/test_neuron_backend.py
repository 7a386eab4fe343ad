"""Builds with backend = "neuron" under the test double, through the CLI as a user runs them.

Each compile is a worker subprocess (a few seconds: it imports torch), so the tiny project is used and
each test builds two targets: the first one compiled (tiny/b1/fp32/p1) is the one the double makes fail,
the second (other/static/fp32/p1) must still be built.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.fakes.env import activate, neuron_env
from tests.helpers.cli import run_cli
from tests.helpers.projects import edit, write_tiny_project

FIRST, SECOND = "tiny/b1/fp32/p1", "other/static/fp32/p1"
CC_VERSION = "2.30.4217.0+5e1f0c2a"
NEURON_VERSIONS = {"torch-neuronx": "2.13.0.2.30.4217", "neuronx-cc": CC_VERSION,
                   "neuronx-distributed": "0.17.4217", "libneuronxla": "2.3.4217.0"}
INSTALL = ("install the real toolchain from AWS's Neuron package index (pip install --extra-index-url "
           "https://pip.repos.neuron.amazonaws.com neuronx-cc==2.* torch-neuronx neuronx-distributed; see "
           "\"On a Neuron host\" in README.md).")


def neuron_project(root: Path, timeout: float = 120, extra: str = "") -> Path:
    cfg = write_tiny_project(root, timeout=timeout, extra=extra)
    return edit(cfg, 'backend = "torchscript"', 'backend = "neuron"')


def build(cfg: Path, env: dict, *patterns: str) -> subprocess.CompletedProcess:
    # one compile at a time: the test double's failure modes hit its first call, which must be FIRST's
    return run_cli("build", "-c", str(cfg), "-n", "1", *patterns, env=env)


def show(cfg: Path, env: dict, ref: str) -> dict:
    r = run_cli("show", ref, "--json", "-c", str(cfg), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def plan(cfg: Path, env: dict) -> dict[str, dict]:
    r = run_cli("plan", "--json", "-c", str(cfg), env=env)
    assert r.returncode == 0, r.stderr
    return {row["target"]: row for row in json.loads(r.stdout)["targets"]}


def calls(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def failure_log(cfg: Path, target: str) -> bytes:
    return (cfg.parent / "artifacts" / "targets" / target / "failure.log").read_bytes()


@pytest.fixture
def proj(tmp_path) -> Path:
    return neuron_project(tmp_path / "proj")


# --------------------------------------------------------------------------- success, no-op, key

def test_build_manifest_noop_and_key(proj, tmp_path):
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log, log_format="summary")
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 targets: 2 built, 0 cached, 0 failed" in r.stdout
    assert len(calls(log)) == 2

    m = show(proj, env, FIRST)
    assert (m["backend"], m["hardware_target"]) == ("neuron", "trn1")
    assert set(m["files"]) == {"model.pt", "model.neff"}  # what a release pins
    assert set(m["logs"]) == {"compile.log", "command.txt", "worker.log"}  # not byte-stable: never pinned
    mt = m["metrics"]
    assert mt["status"] == "PASS" and mt["compiler_status"] == "PASS"
    assert (mt["op_count"], mt["op_count_source"]) == (3, "neuronx-cc log")  # linear, relu, mul
    assert mt["compile_time_s"] > mt["compiler_compile_time_s"] >= 0
    assert mt["diagnostics"] == [] and mt["compiler_peak_rss_bytes"] >= 0
    assert m["toolchain"] == {"torch": m["key_details"]["toolchain"]["torch"], **NEURON_VERSIONS,
                              "neuronx-cc --version": CC_VERSION}
    assert m["key_details"]["toolchain"] == {"torch": m["toolchain"]["torch"], **NEURON_VERSIONS}
    neff = m["compiler"]["neff"]["model.neff"]
    assert neff["build_version"] == CC_VERSION and neff["neff_version_major"] == 2
    assert neff["header_size"] == 1024 and neff["data_size"] == m["files"]["model.neff"]["size"] - 1024
    assert neff["payload_kind"] == "tar.gz" and neff["lnc_size"] == 1
    assert m["compiler"]["logs"]["compile.log"]["op_count"] == 3
    assert m["compiler"]["trace_kwargs"] == {"inline_weights_to_neff": True, "cpu_backend": True}
    assert m["compiler"]["compiler_args"] == ["--optlevel=1", "--target", "trn1",
                                              "--logfile=<workdir>/log-neuron-cc.txt"]
    logs = proj.parent / "artifacts" / "logs" / m["key"]
    assert (logs / "compile.log").read_text().endswith("Compiler status: SUCCESS\n")
    assert b"neuron-build worker: target tiny/b1/fp32/p1" in (logs / "worker.log").read_bytes()

    # a second build compiles nothing
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 0 and "0 built, 2 cached" in r.stdout
    assert len(calls(log)) == 2

    # graph-changing variables and toolchain versions are in the key
    p = plan(proj, {**env, "NEURON_CC_FLAGS": "--auto-cast=none"})
    assert p[FIRST]["state"] == "missing" and p[FIRST]["changed_detail"] == ["env: NEURON_CC_FLAGS"]
    p = plan(proj, {**env, "XLA_USE_BF16": "1", "NEURON_RT_VISIBLE_CORES": "0-1"})
    assert p[FIRST]["changed_detail"] == ["env: XLA_USE_BF16"]
    p = plan(proj, neuron_env("other_torch"))
    assert p[FIRST]["changed_detail"] == ["toolchain: torch-neuronx"]
    assert plan(proj, env)[FIRST]["state"] == "cached"


def test_tensor_parallel_profile(tmp_path, monkeypatch):
    extra = """
    [profiles.tp2]
    compiler_args = ["--optlevel=2"]
    tp_degree = 2

    [models.tpm]
    factory = "tinylib.other:build"
    dtypes = ["fp32"]
    profiles = ["tp2"]
    inputs = [{ name = "x", shape = [2, 16] }]
    """
    cfg = neuron_project(tmp_path / "proj", extra=extra)
    log = tmp_path / "calls.jsonl"
    env = neuron_env(calls=log, has_device=True, log_format="summary")
    r = build(cfg, env, "tpm")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = calls(log)
    assert len(recs) == 2
    assert [Path(a.split("=", 1)[1]).parent.name for rec in recs for a in rec["argv"] if a.startswith("--logfile=")] \
        == ["_tp0", "_tp1"]
    m = show(cfg, env, "tpm/static/fp32/tp2")
    assert set(m["files"]) == {f"tp_{r}{ext}" for r in (0, 1) for ext in (".pt", ".neff")}
    assert set(m["logs"]) == {f"tp_{r}{ext}" for r in (0, 1) for ext in (".compile.log", ".command.txt")} | {
        "worker.log"}
    c = m["compiler"]
    assert c["trace_api"] == "neuronx_distributed.trace.parallel_model_trace" and c["tp_degree"] == 2
    assert c["trace_kwargs"] == {"inline_weights_to_neff": True, "tp_degree": 2}
    assert c["artifact"] == ["tp_0.pt", "tp_1.pt"]
    assert sorted(c["neff"]) == ["tp_0.neff", "tp_1.neff"]
    assert c["neff"]["tp_0.neff"]["uuid"] != c["neff"]["tp_1.neff"]["uuid"]
    assert (m["metrics"]["op_count"], m["metrics"]["op_count_source"], c["op_count_per_rank"]) == (
        1, "neuronx-cc log", [1, 1])
    # the saved ranks load with neuronx-distributed and compute the model
    activate(monkeypatch, "neuron_sdk")
    import torch
    from neuronx_distributed.trace import parallel_model_load

    from neuron_build.store import LocalStore
    loaded = parallel_model_load(str(LocalStore(cfg.parent / "artifacts").artifact_dir(m["key"])))
    torch.manual_seed(1)
    ref = torch.nn.Linear(16, 3)
    x = torch.randn(2, 16)
    assert loaded.tp_degree == 2 and torch.allclose(loaded(x), ref(x), atol=1e-6)


# --------------------------------------------------------------------------- failure classes

KILLED = re.compile(r"neuronx-cc was killed by SIGKILL \(usually the kernel's out-of-memory killer\); "
                    r"peak memory \d+\.\d\d GiB \(neuronx-cc \d+\.\d\d GiB\)")


@pytest.mark.parametrize("mode,status,reason", [
    ("xcg815", "ERROR", "XCG815: Estimated peak HBM usage (22.84) exceeds 16GB. The graph does not fit one "
                        "NeuronCore; use a smaller bucket or shard the model."),
    ("sigkill", "KILLED", KILLED),
])  # the other compiler errors (eoom, evrf, euoc, internal) take the same path: test_neuron_compiler.py
def test_compiler_failure_is_recorded_others_built_and_retried(proj, tmp_path, mode, status, reason):
    log, counter = tmp_path / "calls.jsonl", tmp_path / "count"
    extra = {"mem_mb": 160, "sleep": 2.1} if mode == "sigkill" else {}
    env = neuron_env(calls=log, counter=counter, fail=mode, fail_times=1, **extra)
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 1
    assert "2 targets: 1 built, 0 cached, 1 failed" in r.stdout
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("  FAILED")]
    prefix = f"  FAILED {FIRST}: {status}: "
    assert line.startswith(prefix)
    f = show(proj, env, FIRST)
    assert f["status"] == status and line == prefix + f["reason"]
    if isinstance(reason, str):
        assert f["reason"] == reason
    else:
        assert reason.fullmatch(f["reason"]), f["reason"]
    assert [c["fail"] for c in calls(log)] == [mode, None]
    assert plan(proj, env)[FIRST]["state"] == "failed" and plan(proj, env)[SECOND]["state"] == "cached"
    details = f["details"]
    if mode == "xcg815":
        assert f["exit_code"] == 1 and details["compiler_exit_code"] == 1
        assert details["diagnostics"] == [{"code": "XCG815", "line": 3, "severity": "error", "message":
                                           reason.split(": ", 1)[1]}]
    if mode == "sigkill":
        assert f["exit_code"] == 137 and details["compiler_exit_code"] == -9
        assert details["compiler_peak_rss_bytes"] > 160 * 2**20
        assert f["peak_rss_bytes"] >= details["compiler_peak_rss_bytes"]
    if mode != "sigkill":  # a SIGKILLed compiler leaves only a partial log
        assert b"===== compiler log (neuron/log-neuron-cc.txt) =====" in failure_log(proj, FIRST)
    # the next build retries the failed target (the double now compiles it)
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 targets: 1 built, 1 cached, 0 failed" in r.stdout
    assert len(calls(log)) == 3
    assert show(proj, env, FIRST)["metrics"]["status"] == "PASS"


def test_timeout_kills_the_hung_compiler(tmp_path):
    cfg = neuron_project(tmp_path / "proj", timeout=20)
    log, counter = tmp_path / "calls.jsonl", tmp_path / "count"
    env = neuron_env(calls=log, counter=counter, fail="hang", fail_times=1, hang_max=120)
    r = build(cfg, env, FIRST, "other")
    assert r.returncode == 1
    assert f"  FAILED {FIRST}: TIMEOUT: stopped after 20 s (timeout_s under [build])" in r.stdout
    assert "1 built" in r.stdout
    hung = calls(log)[0]
    assert hung["fail"] == "hang"
    alive = subprocess.run(["ps", "-p", str(hung["pid"])], capture_output=True).returncode == 0
    assert not alive, "the hung neuronx-cc outlived its compile"
    r = build(cfg, env, FIRST)
    assert r.returncode == 0 and "1 built" in r.stdout


def test_transient_failure_is_retried_within_the_build(proj, tmp_path):
    log, counter = tmp_path / "calls.jsonl", tmp_path / "count"
    env = neuron_env(calls=log, counter=counter, fail="transient", fail_times=1)
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 targets: 2 built" in r.stdout
    assert [c["fail"] for c in calls(log)] == ["transient", None, None]
    first = show(proj, env, FIRST)["metrics"]
    assert (first["attempts"], first["status"]) == (2, "PASS")
    assert show(proj, env, SECOND)["metrics"]["attempts"] == 1
    events = [json.loads(ln) for ln in (proj.parent / ".neuron-build" / "build.log").read_text().splitlines()]
    assert [e["target"] for e in events if e["event"] == "transient compiler failure, retrying"] == [FIRST]


def test_transient_failure_beyond_the_retries(proj, tmp_path):
    log, counter = tmp_path / "calls.jsonl", tmp_path / "count"
    env = neuron_env(calls=log, counter=counter, fail="transient", fail_times=3)  # transient_retries = 2
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 1
    reason = ("neuronx-cc exited with status 70 (a transient tool failure): A compiler worker process ended "
              "unexpectedly; the compile was abandoned.")
    assert f"  FAILED {FIRST}: TRANSIENT: {reason}" in r.stdout
    assert "1 built" in r.stdout
    assert [c["fail"] for c in calls(log)] == ["transient"] * 3 + [None]
    f = show(proj, env, FIRST)
    assert (f["status"], f["attempts"], f["exit_code"]) == ("TRANSIENT", 3, 70)
    r = build(proj, env, FIRST)
    assert r.returncode == 0 and "1 built" in r.stdout
    assert len(calls(log)) == 5


def test_toolchain_missing(proj, tmp_path):
    log = tmp_path / "calls.jsonl"
    # the PyPI placeholder: every target fails at once, without a compile
    env = neuron_env("placeholder", calls=log)
    r = build(proj, env, FIRST, "other")
    assert r.returncode == 1 and "2 targets: 0 built, 0 cached, 2 failed" in r.stdout
    placeholder = ("The Neuron toolchain is not installed (found the PyPI placeholder: torch-neuronx 1.0, "
                   f"neuronx-cc 1.0.post1); uninstall them and {INSTALL}")
    assert f"  FAILED {FIRST}: TOOLCHAIN_MISSING: {placeholder}" in r.stdout
    assert f"  FAILED {SECOND}: TOOLCHAIN_MISSING: {placeholder}" in r.stdout
    # no toolchain at all
    r = build(proj, neuron_env(None), "other")
    assert (f"  FAILED {SECOND}: TOOLCHAIN_MISSING: The Neuron toolchain is not installed (no torch-neuronx "
            f"package); {INSTALL}") in r.stdout
    # torch-neuronx built for another torch
    r = build(proj, neuron_env("other_torch"), "other")
    assert (f"  FAILED {SECOND}: TOOLCHAIN_MISSING: The installed torch-neuronx 2.1.2.2.30.4217 is built for "
            "torch==2.1.* but torch ") in r.stdout
    assert calls(log) == []
    # a torch-neuronx too old to compile without a Neuron device: the worker says so
    env = neuron_env(calls=log, signature="2.16")
    r = build(proj, env, "other")
    assert r.returncode == 1
    f = show(proj, env, SECOND)
    assert (f["status"], f["exit_code"]) == ("TOOLCHAIN_MISSING", 3)
    assert f["reason"].startswith("this host has no Neuron device (/dev/neuron* not found) and "
                                  "torch_neuronx.trace() of the installed torch-neuronx 2.13.0.2.30.4217 has no "
                                  "cpu_backend parameter (added in SDK 2.21)")
    assert calls(log) == []
    # with a newer torch-neuronx (same key: the signature switch is not a version) the next build builds it
    r = build(proj, neuron_env(calls=log), "other")
    assert r.returncode == 0 and "1 built" in r.stdout
    assert len(calls(log)) == 1
