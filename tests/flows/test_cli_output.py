"""Output to a reader that went away: no traceback, the shell's 128 + SIGPIPE status."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.cli import REPO


def test_closed_pipe_exits_141_without_a_traceback(tiny):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "plan", "--json", "-c", str(tiny)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # the reader is gone before the command writes its first byte
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
