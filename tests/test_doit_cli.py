"""``doit build`` as a user runs it: usage errors, Ctrl-C and a closed pipe exit with the README's codes
(2, 130, 141) and the messages of ``neuron-build build``, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, run_cli, write_tiny_project

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project

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


def test_doit_usage_errors_exit_2_with_doits_message(tmp_path, capsys):
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
    assert BuildSession(Builder(load_project(cfg))).run(["nosuch"]) == 2
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
