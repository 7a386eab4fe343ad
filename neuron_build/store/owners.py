"""Who holds a lock, a lease or a memory reservation: owner records (pid, host, process start time) and
whether their process still runs on this host."""

from __future__ import annotations

import os
import socket
from typing import Any

from neuron_build.util import utc_now


def _proc_start(pid: int) -> float | None:
    """Start time of a process (seconds since the epoch, as psutil reports it), or None when it is gone."""
    try:
        import psutil
        return psutil.Process(pid).create_time()
    except Exception:
        return None


_starts: dict[int, float | None] = {}


def _my_start() -> float | None:
    """This process's start time (psutil is imported on first use, not on the no-op path)."""
    pid = os.getpid()
    if pid not in _starts:
        _starts[pid] = _proc_start(pid)
    return _starts[pid]


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """Is the process an owner record names still running? None when it ran on another host (unknown).

    A record names a process by pid and start time, so a reused pid does not count as alive.
    """
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    start = _proc_start(pid)
    if start is None:
        return False
    rec = owner.get("proc_start")
    return rec is None or abs(start - rec) < 1.0


def _me(**extra: Any) -> dict[str, Any]:
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(),
            "proc_start": _my_start(), "since": utc_now(), **extra}


__all__ = ["owner_alive"]
