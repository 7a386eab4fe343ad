"""``doit build`` as a user runs it: usage errors, Ctrl-C and a closed pipe exit with the README's codes
(2, 130, 141) and the messages of ``neuron-build build``, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.workspace import Workspace
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import write_tiny_project

BROKEN = '''
[models.bad]
factory = "tinylib.tiny:broken"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 16] }]
'''


def doit(cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                           *args, f"config={cfg}"], capture_output=True, text=True, timeout=timeout)


def test_doit_usage_errors_exit_2_with_doits_message(tmp_path, capsys, monkeypatch):
    cfg = write_tiny_project(tmp_path / "p")
    r = doit(cfg, "build:nosuch")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0] == 'ERROR: Invalid parameter: "build:nosuch". Must be a command, task, or a target.'
    assert "Traceback" not in r.stderr
    r = doit(cfg, "run", "build:nosuch")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines()[0] == ('ERROR: command `run` invalid parameter: "build:nosuch". '
                                        'Must be a task, or a target.')
    r = doit(cfg, "build", "--no-retry")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("ERROR: Error parsing Task: option --no-retry not recognized")
    # neuron-build build's doit run: the same code
    from neuron_build.tasks import BuildSession
    monkeypatch.setenv("NEURON_BUILD_CONFIG", str(cfg))  # the run sets it: restored after the test
    assert BuildSession(Builder(Workspace(load_project(cfg)))).run(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert 'ERROR: command `run` invalid parameter: "build:nosuch". Must be a task, or a target.' in err


def test_doit_retry_failed_0_names_doits_variable(tmp_path):
    cfg = write_tiny_project(tmp_path / "p", extra=BROKEN)
    r = run_cli("build", "-c", str(cfg), "bad")
    assert r.returncode == 1, r.stdout + r.stderr
    r = doit(cfg, "build:bad/static/fp32/p1", "retry_failed=0")
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert ("  FAILED bad/static/fp32/p1: ERROR: not retried (retry_failed=0); failed last time: "
            "RuntimeError: factory exploded on purpose\n") in r.stdout, out
    assert "--no-retry-failed" not in out
    r = run_cli("build", "-c", str(cfg), "--no-retry-failed", "bad")
    assert r.returncode == 1
    assert "not retried (--no-retry-failed); failed last time: " in r.stdout


SLOW = '''
[models.slow]
factory = "tinylib.tiny:slow"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 16] }]
'''


def test_doit_build_ctrl_c_exits_130_without_a_traceback(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during a compile: exit 130, the
    target reported as interrupted, no traceback, no worker left, nothing committed."""
    cfg = write_tiny_project(tmp_path / "p", extra=SLOW)
    p = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                          "build:slow/static/fp32/p1", f"config={cfg}"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    staging = cfg.parent / "artifacts" / "staging"
    deadline = time.monotonic() + 120
    while not (staging.is_dir() and any(staging.iterdir())) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.poll() is None and any(staging.iterdir()), "the compile did not start"
    time.sleep(1.0)  # the worker is in the factory's sleep
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "  FAILED slow/static/fp32/p1: INTERRUPTED: Ctrl-C stopped the build before it finished\n" in out, out
    assert "not built: \n" not in out
    left = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True)
    assert left.stdout == "", f"processes left: {left.stdout}"
    ac = cfg.parent / "artifacts" / "ac"
    assert not ac.exists() or not any(f.is_file() for f in ac.rglob("*"))


SLOW_FIRST = '''
[models.slow]
factory = "tinylib.tiny:slow"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 16] }]
buckets = { batch = [1, 2, 3] }

'''


def test_doit_build_ctrl_c_reports_only_unfinished_targets_interrupted(tmp_path):
    """Ctrl-C while two compiles of three run (``-n 2``), before doit reached the targets after them: the
    up-to-date targets doit never checked are counted cached, not INTERRUPTED; the three slow ones are."""
    from tests.helpers.projects import edit

    cfg = write_tiny_project(tmp_path / "p")
    edit(cfg, "buckets = { batch = [1, 4] }", "buckets = { batch = [1] }")
    edit(cfg, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]')
    edit(cfg, 'profiles = ["p1", "p2"]', 'profiles = ["p1"]')
    r = run_cli("build", "-c", str(cfg), "tiny", "other", env={"PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    edit(cfg, "[models.tiny]", SLOW_FIRST + "[models.tiny]")  # the slow model first in matrix order
    p = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                          "-n", "2", "build", f"config={cfg}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    staging = cfg.parent / "artifacts" / "staging"
    deadline = time.monotonic() + 120
    while (not staging.is_dir() or len(list(staging.iterdir())) < 2) and p.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.poll() is None and len(list(staging.iterdir())) >= 2, "the two compiles did not start"
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "-- build:tiny/b1/fp32/p1" not in out  # doit never got to check it
    assert "\n5 targets: 0 built, 2 cached, 3 failed\n" in out, out
    for t in ("slow/b1/fp32/p1", "slow/b2/fp32/p1", "slow/b3/fp32/p1"):
        assert f"  FAILED {t}: INTERRUPTED: Ctrl-C stopped the build before it finished\n" in out, out
    assert "tiny/b1/fp32/p1" not in out.split("\n5 targets")[1] and "other/static" not in out.split("\n5 targets")[1]


def test_neuron_build_build_ctrl_c_exits_130_without_a_summary(tmp_path):
    """The same Ctrl-C on ``neuron-build build``: exit 130, no traceback, no summary counting it failed."""
    cfg = write_tiny_project(tmp_path / "p", extra=SLOW)
    p = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "build", "-c", str(cfg), "slow"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    staging = cfg.parent / "artifacts" / "staging"
    deadline = time.monotonic() + 120
    while not (staging.is_dir() and any(staging.iterdir())) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.poll() is None, "the compile did not start"
    time.sleep(1.0)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, out + err
    assert "Traceback" not in err and "failed" not in out, out + err


def _first_line_then_close(cmd: list[str]) -> tuple[int, str, str]:
    """Run ``cmd`` as ``cmd | head -1`` does: read one line of its stdout, close the pipe, wait."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    return p.wait(timeout=300), first, err


def test_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    rc, first, err = _first_line_then_close(
        [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
         "build:tiny/b1/fp32/p1", "build:tiny/b4/fp32/p1", f"config={cfg}"])
    assert first.startswith(".  build:tiny/b"), first
    assert rc == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    rc, first, err = _first_line_then_close(
        [sys.executable, "-m", "neuron_build.cli", "build", "-c", str(cfg), "tiny/b1/bf16/p1", "tiny/b4/bf16/p1"])
    assert first.startswith(".  build:tiny/b"), first
    assert rc == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
