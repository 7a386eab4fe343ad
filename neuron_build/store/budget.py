"""The host-memory budget of the compiles running on this host: ``<store>/locks/memory.json``, a ledger of
reservations guarded by ``memory.lock`` (one entry per compile with its pid, so a dead process's
reservation is dropped). Re-exported by :mod:`neuron_build.store.locks`."""

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
from neuron_build.store.layout import LOCKS_DIR
from neuron_build.store.owners import owner_alive, owner_record
from neuron_build.util import is_disk_full, read_json, utc_now, write_json_atomic

if TYPE_CHECKING:
    from filelock import FileLock  # noqa: F401

GB = 10**9


class MemoryBudget:
    """A cross-process bound on the summed expected peak memory of the compiles running on this host.

    The ledger ``<store>/locks/memory.json`` lists reservations ``{id, pid, host, boot_id, proc_start_ticks,
    bytes, target, state, since, seq}``; it is read and written under ``<store>/locks/memory.lock``. Reservations
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
        self.dir = Path(store_root) / LOCKS_DIR
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
        entry = owner_record(id=rid, bytes=int(nbytes), target=target, state="waiting", seq=time.time_ns())
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


__all__ = ["GB", "MemoryBudget"]
