"""The CLI as a user runs it: ``neuron-build`` in a subprocess, on a pseudo-terminal, and the build log read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: the checkout's root (the folder of pyproject.toml)
REPO = Path(__file__).resolve().parents[2]
#: the Neuron toolchain's test double
FAKES = REPO / "tests" / "fakes"
#: captured compiler logs (neuronx-cc's) the log parser's tests read
FIXTURES = REPO / "tests" / "fixtures"


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600,
            unset: tuple[str, ...] = ()):
    """Run ``neuron-build`` as a user would, in a subprocess, in this environment plus ``env`` and without the
    variables named in ``unset``. Returns CompletedProcess (text)."""
    e = {k: v for k, v in os.environ.items() if k not in unset}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "neuron_build.cli", *args], cwd=cwd, env=e, text=True,
                          capture_output=True, timeout=timeout)


def events(state_dir: Path, name: str | None = None) -> list[dict]:
    """Events of the project's build log (every process appends to it), optionally only those named."""
    log = state_dir / "build.log"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        ev = json.loads(line)
        if name is None or ev.get("event") == name:
            out.append(ev)
    return out


def compiles_in_log(state_dir: Path) -> list[str]:
    """Target ids of every compile started, read from the project's build log."""
    return [ev["target"] for ev in events(state_dir, "compiling")]


def in_a_terminal(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300,
                  columns: int = 160) -> str:
    """Run ``args`` with stdin, stdout and stderr on a pseudo-terminal (``columns`` wide), in ``env`` (default
    ``os.environ``; this checkout first on PYTHONPATH; NO_COLOR, FORCE_COLOR, COLUMNS and LINES removed); return what it
    wrote, escape codes included."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    e = {k: v for k, v in (os.environ if env is None else env).items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    e.update({"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH")) if p),
              "TERM": "xterm-256color"})
    p = subprocess.Popen(args, cwd=cwd, env=e, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    buf, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    return buf.decode(errors="replace")

