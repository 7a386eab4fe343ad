"""Failures are not artifacts: killed, timed-out, transient and broken compiles are reported as such,
remembered, retried by default and skipped on request, while the rest of the build completes."""

from __future__ import annotations

import json

import pytest

from tests.helpers.faultkit import REPO, compile_counts, quick_ids, run_cli, start, verify, write_quick_project

BAD_MODELS = '''
[models.hog]
factory = "quicklib.quick:hog"
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{ name = "x", shape = [2, 8] }]

[models.sleepy]
factory = "quicklib.quick:slow"
kwargs = { seconds = 600 }
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{ name = "x", shape = [2, 8] }]

[models.flaky]
factory = "quicklib.quick:flaky"
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{ name = "x", shape = [2, 8] }]

[models.bad]
factory = "quicklib.quick:broken"
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{ name = "x", shape = [2, 8] }]
'''
FAILING = {"hog/static/fp32/p": "KILLED", "sleepy/static/fp32/p": "TIMEOUT", "flaky/static/fp32/p": "TRANSIENT",
           "bad/static/fp32/p": "ERROR"}


def failed_lines(stdout: str) -> dict[str, str]:
    out = {}
    for ln in stdout.splitlines():
        if ln.startswith("  FAILED "):
            tid, _, rest = ln[len("  FAILED "):].partition(": ")
            out[tid] = rest
    return out


@pytest.mark.slow
def test_failed_compiles_are_reported_remembered_retried_or_skipped(tmp_path):
    """Fault: four compiles fail in the four ways a compile fails: the worker is SIGKILLed (what the
    out-of-memory killer does), it hangs past timeout_s, it exits with the transient status 70 (retried
    once within the build), and the model raises. With `-n 2` the two good targets still build, each
    failure is reported with its status, the exit status is 1, nothing failed is stored as an artifact,
    and `plan` shows the failures with status, reason and attempts. The next build retries them by
    default; --no-retry-failed (and doit's retry_failed=0) skips them without compiling, still failing."""
    cfg = write_quick_project(tmp_path / "p", n=2, timeout=12, retries=1, models_extra=BAD_MODELS)
    state = cfg.parent / ".neuron-build"
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "6 targets: 2 built, 0 cached, 4 failed" in r.stdout
    lines = failed_lines(r.stdout)
    assert {t: v.split(":")[0] for t, v in lines.items()} == FAILING
    assert lines["hog/static/fp32/p"].startswith("KILLED: killed by SIGKILL (usually the kernel's out-of-memory killer)")
    assert lines["sleepy/static/fp32/p"] == "TIMEOUT: stopped after 12 s (timeout_s under [build])"
    assert lines["flaky/static/fp32/p"] == "TRANSIENT: exit status 70: transient tool failure"
    assert lines["bad/static/fp32/p"] == "ERROR: RuntimeError: factory exploded on purpose"
    counts = compile_counts(state)
    assert counts == {**{t: 1 for t in quick_ids(2)}, **{t: 1 for t in FAILING}, "flaky/static/fp32/p": 2}
    rc, rep = verify(cfg)
    assert rc == 0 and rep["ok"] == 2  # only the two good artifacts are objects

    r = run_cli("plan", "--json", "-c", str(cfg))
    rows = {row["target"]: row for row in json.loads(r.stdout)["targets"]}
    for t, status in FAILING.items():
        assert rows[t]["state"] == "failed"
        assert rows[t]["failure"]["status"] == status
    assert rows["flaky/static/fp32/p"]["failure"]["attempts_total"] == 2
    assert rows["bad/static/fp32/p"]["failure"]["attempts_total"] == 1
    r = run_cli("plan", "-c", str(cfg))
    assert "failed   bad/static/fp32/p" in r.stdout and "ERROR: RuntimeError: factory exploded on purpose (failed 1x" in r.stdout
    assert "2 cached, 0 missing, 4 failed" in r.stdout

    # --no-retry-failed: nothing compiles, the failures are still reported, exit 1
    r = run_cli("build", "-n", "2", "--no-retry-failed", "-c", str(cfg))
    assert r.returncode == 1
    assert compile_counts(state) == counts
    lines = failed_lines(r.stdout)
    assert set(lines) == set(FAILING)
    assert all("not retried (--no-retry-failed); failed last time: " in v for v in lines.values())
    # the same through doit, with worker processes
    out = tmp_path / "doit.out"
    p = start(["-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent), "-n", "2", "-P", "process",
               "build", f"config={cfg}", "retry_failed=0"], out)
    rc = p.wait(timeout=120)
    assert rc in (1, 2), out.read_text()  # doit: 1 = a task failed, 2 = the `build` group's unmet dependencies
    assert compile_counts(state) == counts
    text = out.read_text()
    assert all(f"{t}: {status}: not retried" in text for t, status in FAILING.items()), text

    # by default every build retries: the quick ones fail again, counted across builds
    r = run_cli("build", "-c", str(cfg), "flaky", "bad")
    assert r.returncode == 1
    after = compile_counts(state)
    assert after["flaky/static/fp32/p"] == 4 and after["bad/static/fp32/p"] == 2
    rows = {row["target"]: row for row in json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)["targets"]}
    assert rows["flaky/static/fp32/p"]["failure"]["attempts_total"] == 4
    assert rows["bad/static/fp32/p"]["failure"]["attempts_total"] == 2
