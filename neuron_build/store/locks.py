"""Cross-process coordination of builders that share a store: per-key compile locks and a host-memory
budget.

Both live under ``<store>/locks/``:

- ``<key>.lock``: an exclusive ``flock`` (through the ``filelock`` library) held while one builder compiles
  and publishes ``key``; ``<key>.owner.json`` beside it records the holder (pid, host, process start time,
  target, since when). The kernel drops a ``flock`` when its holder dies, so a SIGKILLed builder never
  blocks the next one; the owner record it leaves is reported and replaced ("stale lock"). A lock that is
  still held while its recorded owner is dead on this host (an orphaned child kept the file descriptor) is
  broken after a grace period by moving the lock file aside.
- ``memory.json``: the ledger of host-memory reservations of running compiles (guarded by
  ``memory.lock``), one entry per compile with its pid, so a dead process's reservation is dropped.

Liveness is judged only for owners on this host (same ``socket.gethostname()``); owners on other hosts are
waited for.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.log import get_logger
from neuron_build.util import is_disk_full, read_json, utc_now, write_json_atomic

if TYPE_CHECKING:
    from filelock import FileLock

GB = 10**9




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


_MY_PID = os.getpid()


class KeyLock:
    """The exclusive compile lock of one key, across threads and processes on one store.

    Use as a context manager around "check again, compile, publish". While it waits it logs ``waiting for
    lock`` (with the holder's pid, host and start) and then ``still waiting for lock`` every
    ``heartbeat_s`` seconds.

    Args:
        store_root: the store folder; the lock is ``<store_root>/locks/<key>.lock``.
        key: the artifact key (64 hex chars).
        target: the target id, recorded in the owner record (informational).
        poll_s: seconds between attempts while waiting.
        heartbeat_s: seconds between "still waiting" events.
        stale_grace_s: how long a lock must stay held while its recorded owner is dead (on this host)
            before it is broken. Covers the moment between a new holder's flock and its owner record.

    Attributes after entering:
        waited_s: seconds spent waiting.
        waited_for: the owner record of the holder it waited for (None if it did not wait).
        stale: owner records of dead holders that it found and replaced or broke.
    """

    def __init__(self, store_root: str | Path, key: str, target: str = "", poll_s: float = 0.2,
                 heartbeat_s: float = 15.0, stale_grace_s: float = 5.0):
        self.dir = Path(store_root) / "locks"
        self.key = key
        self.path = self.dir / f"{key}.lock"
        self.owner_path = self.dir / f"{key}.owner.json"
        self.target = target
        self.poll_s, self.heartbeat_s, self.stale_grace_s = poll_s, heartbeat_s, stale_grace_s
        self.waited_s = 0.0
        self.waited_for: dict[str, Any] | None = None
        self.stale: list[dict[str, Any]] = []
        self._lock: FileLock | None = None
        self._token = secrets.token_hex(6)
        self._log = get_logger(target=target or None, key=key[:12])

    # -- acquire / release -----------------------------------------------------------------------
    def acquire(self) -> KeyLock:
        self.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        next_beat = None
        dead_since: tuple[float, Any, int] | None = None
        from filelock import FileLock, Timeout  # imported here: off the no-op path

        while True:
            lock = FileLock(str(self.path))
            try:
                lock.acquire(timeout=self.poll_s, poll_interval=min(0.05, self.poll_s))
            except Timeout:
                owner = self.owner()
                now = time.monotonic()
                if next_beat is None:
                    self.waited_for = owner
                    self._log.info("waiting for lock", **_who(owner), lock=str(self.path))
                    next_beat = now + self.heartbeat_s
                elif now >= next_beat:
                    self._log.info("still waiting for lock", waited_s=round(now - t0), **_who(owner))
                    next_beat = now + self.heartbeat_s
                if owner is not None and owner_alive(owner) is False:
                    ident = (owner.get("pid"), owner.get("proc_start"))
                    ino = _inode(self.path)
                    if dead_since is None or dead_since[1] != ident or dead_since[2] != ino:
                        dead_since = (now, ident, ino)
                    elif now - dead_since[0] >= self.stale_grace_s:
                        self._break(owner, ino)
                        dead_since = None
                else:
                    dead_since = None
                continue
            if not self._holds_current_file(lock):
                lock.release()  # the file was moved aside (broken) while we locked it: lock the new one
                continue
            break
        self._lock = lock
        self.waited_s = time.monotonic() - t0
        left = self.owner()
        if left is not None and left.get("token") != self._token:
            # the previous holder died with the lock (the kernel released its flock), leaving its record
            self.stale.append(left)
            self._log.warning("stale lock from a dead builder replaced", **_who(left),
                              alive=owner_alive(left))
        try:
            write_json_atomic(self.owner_path, _me(token=self._token, key=self.key, target=self.target))
        except OSError as e:
            self._log.warning("could not write the lock's owner record", error=str(e))
        return self

    def release(self) -> None:
        if self._lock is None:
            return
        try:
            cur = self.owner()
            if cur is not None and cur.get("token") == self._token:
                self.owner_path.unlink(missing_ok=True)
        except OSError:
            pass
        self._lock.release()
        self._lock = None

    def __enter__(self) -> KeyLock:
        return self if self._lock is not None else self.acquire()  # (already acquired: just release on exit)

    def __exit__(self, *exc: Any) -> None:
        self.release()

    # -- owner records and stale locks ------------------------------------------------------------------
    def owner(self) -> dict[str, Any] | None:
        """The current owner record, or None."""
        rec = read_json(self.owner_path)
        return rec if isinstance(rec, dict) else None

    def _holds_current_file(self, lock: FileLock) -> bool:
        fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
        if not isinstance(fd, int):
            return True
        try:
            a, b = os.fstat(fd), os.stat(self.path)
        except OSError:
            return False
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)

    def _break(self, owner: dict[str, Any], ino: int) -> None:
        """Move a lock file aside whose recorded owner died while something else kept it locked.

        Done under ``<key>.break.lock`` and only if the lock file and the owner record are still the ones
        judged stale, so two waiters never break a lock that a live builder has just taken.
        """
        from filelock import FileLock

        with FileLock(str(self.dir / f"{self.key}.break.lock")):
            cur = self.owner()
            if (cur is None or _inode(self.path) != ino or cur.get("pid") != owner.get("pid")
                    or cur.get("proc_start") != owner.get("proc_start") or owner_alive(cur) is not False):
                return
            aside = self.dir / f"{self.key}.lock.stale-{owner.get('pid')}-{secrets.token_hex(3)}"
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                return
            self.owner_path.unlink(missing_ok=True)
        self.stale.append(owner)
        self._log.warning("broke stale lock", **_who(owner), moved_to=aside.name,
                          why="its owner is dead but the lock stayed held (an orphaned child kept it)")


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


def _who(owner: dict[str, Any] | None) -> dict[str, Any]:
    if owner is None:
        return {"held_by_pid": None}
    return {"held_by_pid": owner.get("pid"), "held_by_host": owner.get("host"), "held_since": owner.get("since"),
            "held_for_target": owner.get("target")}


# ------------------------------------------------------------------------------------------------------
# host memory

class MemoryBudget:
    """A cross-process bound on the summed expected peak memory of the compiles running on this host.

    The ledger ``<store>/locks/memory.json`` lists reservations ``{id, pid, host, proc_start, bytes,
    target, state, since, seq}``; it is read and written under ``<store>/locks/memory.lock``. Reservations
    of processes that are no longer running on this host are dropped by whoever reads the ledger next.
    Waiting compiles are admitted first come, first served; a compile is admitted when the running
    reservations on this host plus its own fit in ``max_bytes``, or when nothing else runs on this host
    (a compile larger than the bound still runs, alone).

    Args:
        store_root: the store folder.
        max_bytes: the bound in bytes, or None for no bound (``reserve`` then does nothing).
        poll_s: seconds between admission attempts while waiting.
        heartbeat_s: seconds between "still waiting for host memory" events.
    """

    def __init__(self, store_root: str | Path, max_bytes: int | None, poll_s: float = 0.25,
                 heartbeat_s: float = 15.0):
        self.dir = Path(store_root) / "locks"
        self.path = self.dir / "memory.json"
        self.max_bytes = max_bytes
        self.poll_s, self.heartbeat_s = poll_s, heartbeat_s

    @contextmanager
    def _ledger(self) -> Iterator[dict[str, Any]]:
        from filelock import FileLock

        self.dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.dir / "memory.lock")):
            raw = read_json(self.path)
            led = raw if isinstance(raw, dict) and isinstance(raw.get("reservations"), list) else {"reservations": []}
            before = json.dumps(led, sort_keys=True)
            led["reservations"] = [r for r in led["reservations"]
                                   if isinstance(r, dict) and owner_alive(r) is not False]
            yield led
            if json.dumps(led, sort_keys=True) != before:
                write_json_atomic(self.path, led)

    def reservations(self) -> list[dict[str, Any]]:
        """The live reservations (running and waiting) of every host."""
        with self._ledger() as led:
            return list(led["reservations"])

    @contextmanager
    def reserve(self, nbytes: int, target: str = "", log=None, source: str = "") -> Iterator[dict[str, Any]]:
        """Hold a reservation of ``nbytes`` for the duration of the ``with`` block, waiting for admission.

        Yields a dict: ``waited_s`` (seconds spent waiting) and ``in_use_bytes`` (what the other running
        compiles on this host had reserved when this one was admitted).
        """
        info: dict[str, Any] = {"waited_s": 0.0, "in_use_bytes": 0}
        if self.max_bytes is None:
            yield info
            return
        log = log or get_logger(target=target or None)
        rid = f"{os.getpid()}-{secrets.token_hex(6)}"
        host = socket.gethostname()
        entry = _me(id=rid, bytes=int(nbytes), target=target, state="waiting", seq=time.time_ns())
        registered = False
        try:
            try:
                with self._ledger() as led:
                    led["reservations"].append(entry)
                registered = True
            except OSError as e:
                if not is_disk_full(e):
                    raise
                log.warning("host-memory ledger not writable (disk full); compiling without a reservation",
                            error=str(e))
            t0 = time.monotonic()
            next_beat = None
            while registered:
                try:
                    admitted = self._try_admit(rid, host, entry, nbytes, info)
                except OSError as e:
                    if not is_disk_full(e):
                        raise
                    log.warning("host-memory ledger not writable (disk full); compiling without waiting",
                                error=str(e))
                    break
                if admitted:
                    break
                running, in_use, queued = info.pop("_running"), info.pop("_in_use"), info.pop("_queued")
                now = time.monotonic()
                if next_beat is None or now >= next_beat:
                    log.info("waiting for host memory" if next_beat is None else "still waiting for host memory",
                             need_gb=round(nbytes / GB, 3), in_use_gb=round(in_use / GB, 3),
                             max_host_memory_gb=round(self.max_bytes / GB, 3), running=running,
                             queued_before=queued, estimate=source or None)
                    next_beat = now + self.heartbeat_s
                time.sleep(self.poll_s)
            info["waited_s"] = round(time.monotonic() - t0, 3)
            yield info
        finally:
            if registered:
                try:
                    with self._ledger() as led:
                        led["reservations"] = [r for r in led["reservations"] if r.get("id") != rid]
                except OSError as e:  # a full disk: the entry is dropped once this process has exited
                    log.warning("could not release the host-memory reservation", error=str(e))

    def _try_admit(self, rid: str, host: str, entry: dict[str, Any], nbytes: int, info: dict[str, Any]) -> bool:
        """One admission attempt under the ledger lock; True when admitted (the entry is then running)."""
        with self._ledger() as led:
            mine = [r for r in led["reservations"] if r.get("host") == host]
            running = [r for r in mine if r.get("state") == "running"]
            waiting = sorted((r for r in mine if r.get("state") == "waiting"),
                             key=lambda r: (r.get("seq", 0), r.get("id", "")))
            in_use = sum(int(r.get("bytes", 0)) for r in running)
            info["_running"], info["_in_use"] = len(running), in_use
            info["_queued"] = sum(1 for r in waiting if (r.get("seq", 0), r.get("id", "")) < (entry["seq"], rid))
            if not any(r.get("id") == rid for r in mine):  # dropped (e.g. the ledger was reset): queue again
                led["reservations"].append(entry)
            elif waiting and waiting[0].get("id") == rid and (not running or in_use + nbytes <= self.max_bytes):
                for r in led["reservations"]:
                    if r.get("id") == rid:
                        r["state"] = "running"
                        r["since"] = utc_now()
                info["in_use_bytes"] = in_use
                for k in ("_running", "_in_use", "_queued"):
                    info.pop(k)
                return True
            return False


__all__ = ["KeyLock", "MemoryBudget", "owner_alive", "GB"]
