"""Cross-process coordination of builders that share a store: per-key compile locks and a host-memory
budget.

A folder store keeps them under ``<store>/locks/``; a store at a URL has the lease objects
``leases/<key>.json`` (:class:`LeaseLock`), since file locks do not cross hosts:

- ``<key>.lock``: an exclusive ``flock`` (through the ``filelock`` library) held while one builder compiles
  and publishes ``key``; ``<key>.owner.json`` beside it records the holder (pid, host, boot id, process start in clock ticks,
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
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.errors import NeuronBuildError, StoreError
from neuron_build.log import get_logger
from neuron_build.store import layout
from neuron_build.store.owners import owner_alive, owner_record, process_identity
from neuron_build.util import json_bytes, read_json, write_json_atomic

if TYPE_CHECKING:
    from filelock import FileLock

#: Seconds a compile lease lasts without renewal; the holder renews it every quarter of this.
LEASE_TTL_S = 60.0




_MY_PID = os.getpid()


class LockCancelled(NeuronBuildError):
    """The wait for a lock was stopped (its ``stop`` event was set) before the lock was taken."""


def _cancelled(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise LockCancelled("the wait for the lock was stopped")


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
        self.dir = Path(store_root) / layout.LOCKS_DIR
        self.key = key
        self.path = Path(store_root) / layout.lock_path(key)
        self.owner_path = Path(store_root) / layout.lock_path(key, ".owner.json")
        self.target = target
        self.poll_s, self.heartbeat_s, self.stale_grace_s = poll_s, heartbeat_s, stale_grace_s
        self.waited_s = 0.0
        self.waited_for: dict[str, Any] | None = None
        self.stale: list[dict[str, Any]] = []
        self._lock: FileLock | None = None
        self._token = secrets.token_hex(6)
        self._log = get_logger(target=target or None, key=key[:12])

    # -- acquire / release -----------------------------------------------------------------------
    def acquire(self, stop: threading.Event | None = None) -> KeyLock:
        """Take the lock, waiting while another builder holds it.

        Raises:
            LockCancelled: ``stop`` was set while waiting (nothing is held).
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        next_beat = None
        dead_since: tuple[float, Any, int] | None = None
        from filelock import FileLock, Timeout  # imported here: off the no-op path

        while True:
            _cancelled(stop)
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
                    ident = process_identity(owner)
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
            write_json_atomic(self.owner_path, owner_record(token=self._token, key=self.key, target=self.target))
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
            if (cur is None or _inode(self.path) != ino or process_identity(cur) != process_identity(owner)
                    or owner_alive(cur) is not False):
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


class LeaseLock:
    """The exclusive compile lock of one key across hosts: a lease object ``leases/<key>.json`` holding its
    owner (host, pid, process start, a random token, target, since) and its expiry (``expires``, seconds
    since the epoch). The same interface as :class:`~neuron_build.store.locks.KeyLock`.

    Taken create-only; renewed by a heartbeat thread every quarter of ``ttl_s`` through compare-and-swap
    on its token (S3: the ETag); released on exit by a conditional delete. A lease that expired (its
    holder died or lost the network) or whose owner is dead on this host is taken over by
    compare-and-swap, so of two waiters exactly one wins. A holder whose renewal fails logs it and keeps
    compiling; a rival can take the lease only after it has expired.

    Args:
        store: the store the lease lives in (any :class:`~neuron_build.store.core.Store`).
        key: the artifact key.
        target: the target id (informational, in the lease).
        poll_s: seconds between attempts while waiting.
        heartbeat_s: seconds between "still waiting for lock" events.
        ttl_s: seconds a lease lasts without renewal.

    Attributes after entering:
        waited_s: seconds spent waiting. waited_for: the lease of the holder it waited for (or None).
        stale: leases of dead or expired holders that it took over.
    """

    def __init__(self, store: Any, key: str, target: str = "", poll_s: float = 0.2,
                 heartbeat_s: float = 15.0, ttl_s: float = LEASE_TTL_S):
        self.store, self.key, self.target = store, key, target
        self.path = f"{store.location}/{layout.lease_path(key)}"
        self.rel = layout.lease_path(key)
        self.poll_s, self.heartbeat_s, self.ttl_s = poll_s, heartbeat_s, ttl_s
        self.waited_s = 0.0
        self.waited_for: dict[str, Any] | None = None
        self.stale: list[dict[str, Any]] = []
        self._token = secrets.token_hex(8)
        self._etag: str | None = None
        self._held = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._mutex = threading.Lock()
        self._log = get_logger(target=target or None, key=key[:12])

    def _lease(self) -> bytes:
        return json_bytes(owner_record(token=self._token, key=self.key, target=self.target,
                              expires=time.time() + self.ttl_s, ttl_s=self.ttl_s))

    def owner(self) -> dict[str, Any] | None:
        """The current lease, or None."""
        data = self.store.get_object(self.rel)
        try:
            rec = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) else None

    def _ref(self) -> tuple[dict[str, Any] | None, str | None, bool]:
        data, token = self.store.object_ref(self.rel)
        if data is None:
            return None, None, False
        try:
            rec = json.loads(data)
        except ValueError:
            return None, token, True
        return (rec if isinstance(rec, dict) else None), token, True

    def acquire(self, stop: threading.Event | None = None) -> LeaseLock:
        """Take the lease, waiting while a live holder has it.

        Raises:
            LockCancelled: ``stop`` was set while waiting (nothing is held).
        """
        t0 = time.monotonic()
        next_beat = None
        while True:
            _cancelled(stop)
            data = self._lease()
            if self.store.put_object(self.rel, data, create_only=True):
                _, self._etag = self.store.object_ref(self.rel)
                break
            rec, token, present = self._ref()
            if not present:
                continue  # released between our two calls: try again at once
            if rec is not None and rec.get("token") == self._token:  # ours: the answer to our put was lost
                self._etag = token
                break
            expired = rec is None or not isinstance(rec.get("expires"), int | float) or rec["expires"] < time.time()
            dead = rec is not None and owner_alive(rec) is False
            if expired or dead:
                if self.store.swap_object(self.rel, data, token):
                    _, self._etag = self.store.object_ref(self.rel)
                    self.stale.append(rec or {})
                    self._log.warning("took over a stale compile lease", **_who(rec),
                                      why="expired" if expired else "its owner is dead on this host")
                    break
                continue
            now = time.monotonic()
            if next_beat is None:
                self.waited_for = rec
                self._log.info("waiting for lock", **_who(rec), lock=self.path)
                next_beat = now + self.heartbeat_s
            elif now >= next_beat:
                self._log.info("still waiting for lock", waited_s=round(now - t0), **_who(rec))
                next_beat = now + self.heartbeat_s
            time.sleep(self.poll_s)
        self.waited_s = time.monotonic() - t0
        self._held = True
        self._stop.clear()
        self._beat = threading.Thread(target=self._renew_loop, name=f"lease-{self.key[:12]}", daemon=True)
        self._beat.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with self._mutex:
                if not self._held:
                    return
                try:
                    if self.store.swap_object(self.rel, self._lease(), self._etag):
                        _, self._etag = self.store.object_ref(self.rel)
                    else:
                        self._log.warning("compile lease lost (another builder took it over)", lock=self.path)
                        self._held = False
                        return
                except StoreError as e:
                    self._log.warning("could not renew the compile lease", error=str(e), lock=self.path)

    def abandon(self) -> None:
        """Stop renewing the lease without a call to the store (which cannot be reached): it expires
        ``ttl_s`` after its last renewal."""
        self._stop.set()
        self._held = False  # (no mutex: a renewal stuck on the wire must not hold this up)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        with self._mutex:
            if not self._held:
                return
            self._held = False
            try:
                if self._etag is not None:
                    self.store.delete_object_if(self.rel, self._etag)
            except StoreError as e:  # it expires by itself
                self._log.warning("could not release the compile lease", error=str(e), lock=self.path)

    def __enter__(self) -> LeaseLock:
        return self if self._held else self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()



__all__ = ["LEASE_TTL_S", "KeyLock", "LeaseLock", "LockCancelled"]
