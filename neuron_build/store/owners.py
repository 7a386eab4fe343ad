"""Who holds a lock, a lease or a memory reservation: owner records (pid, host, boot id, process start in
clock ticks after boot) and whether their process still runs on this host."""

from __future__ import annotations

import os
import socket
from typing import Any

from neuron_build.util import utc_now


def proc_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot: field 22 (``starttime``) of
    ``/proc/<pid>/stat`` [proc(5)]; None when it is gone (or there is no ``/proc``). Unlike a wall-clock start
    time (psutil's ``create_time`` is the boot time, which the kernel derives from the wall clock, plus these
    ticks) it never moves while the process lives, so a clock step cannot make a live owner look dead."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return None
    try:  # field 2 (comm) is in parentheses and may hold spaces or ')': count from the last ')'
        return int(data[data.rindex(b")") + 2:].split()[19])  # fields 3, 4, ... -> field 22 is index 19
    except (ValueError, IndexError):
        return None


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``, new at every boot), or None without one: clock
    ticks after boot name a process only within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


_starts: dict[int, int | None] = {}


def _my_start() -> int | None:
    """This process's start in clock ticks after boot (read once per process)."""
    pid = os.getpid()
    if pid not in _starts:
        _starts[pid] = proc_start_ticks(pid)
    return _starts[pid]


def process_identity(owner: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(pid, boot id, start ticks) of an owner record: one process, whatever became of its pid."""
    return owner.get("pid"), owner.get("boot_id"), owner.get("proc_start_ticks")


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """Is the process an owner record names still running? None when it ran on another host (unknown).

    A record names a process by pid, boot id and start in clock ticks after boot (``/proc/<pid>/stat``
    field 22; :func:`proc_start_ticks`): a reused pid, or a pid of an earlier boot, does not count as alive,
    and no wall-clock time is compared, so a clock step never makes a live holder look dead. A record
    without them (written before they were recorded) counts as alive while its pid runs.
    """
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return False
    rec_boot, rec_ticks = owner.get("boot_id"), owner.get("proc_start_ticks")
    if rec_boot is not None and boot_id() is not None and rec_boot != boot_id():
        return False  # the host rebooted since: every process of that boot is gone
    ticks = proc_start_ticks(pid)
    if ticks is None:
        return _pid_exists(pid) if proc_start_ticks(os.getpid()) is None else False
    return rec_ticks is None or ticks == rec_ticks


def _pid_exists(pid: int) -> bool:
    """Without ``/proc``: does a process ``pid`` exist (signal 0)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def owner_record(**extra: Any) -> dict[str, Any]:
    """The owner record of this process (``pid``, ``host``, ``boot_id``, ``proc_start_ticks``, ``since``: UTC
    ISO-8601), with the ``extra`` fields, as a lock, a lease or a memory reservation records its holder
    (:func:`owner_alive` reads it back)."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot_id": boot_id(),
            "proc_start_ticks": _my_start(), "since": utc_now(), **extra}


__all__ = ["boot_id", "owner_alive", "owner_record", "proc_start_ticks", "process_identity"]
