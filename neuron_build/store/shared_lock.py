"""The compile lock of a key in a read-through store: this host's file lock, then the remote's lease.

Builders on one host coordinate through the local store's :class:`~neuron_build.store.locks.KeyLock`;
builders on different hosts that share a remote (``[build] remote``) coordinate through the remote's lease
(:class:`~neuron_build.store.locks.LeaseLock`, ``leases/<key>.json`` with owner and expiry). A builder
takes both, in that order, before it compiles a key that neither store holds, and keeps both until its
push is done, so of the hosts building an overlapping matrix one compiles each key and the others wait and
download its artifact (one compile and one blob per key). A holder that dies stops renewing its lease,
which then expires (``LEASE_TTL_S`` after its last renewal) and is taken over.

The lease fails open, as reads of the remote do: a remote that cannot be reached, or cannot hold a lease
(a filesystem without conditional writes), is warned about and the compile goes on under the local lock
alone; on a remote found unreachable earlier in the process no lease is tried (no second wait on a dark
network, :mod:`~neuron_build.store.wire`), and a held lease is left to expire rather than released over it.
"""

from __future__ import annotations

from typing import Any

from neuron_build.errors import StoreError, StoreUnreachable


class SharedKeyLock:
    """The local lock then the remote lease of one key; the interface of
    :class:`~neuron_build.store.locks.KeyLock` (``acquire``, ``release``, a context manager, ``path``,
    ``waited_s``, ``waited_for``, ``stale``).

    Args:
        store: the :class:`~neuron_build.store.tiered.ReadThroughStore` (its ``local``, ``remote``,
            ``unreachable`` and its one-warning hook are used).
        key: the artifact key. target: its target id (in the lock records). heartbeat_s: seconds
            between "still waiting for lock" events.

    Attributes after entering:
        lease: the remote lease held (None: the local lock alone, the remote being unusable).
        waited_s: seconds waited for both. waited_for: the holder waited for (the remote one first).
    """

    def __init__(self, store: Any, key: str, target: str = "", heartbeat_s: float = 15.0):
        self.store, self.key, self.target, self.heartbeat_s = store, key, target, heartbeat_s
        self.local = store.local.key_lock(key, target=target, heartbeat_s=heartbeat_s)
        self.path = self.local.path
        self.lease: Any = None
        self.waited_s = 0.0
        self.waited_for: dict[str, Any] | None = None
        self.stale: list[dict[str, Any]] = []
        self._held = False

    def acquire(self, stop: Any = None) -> SharedKeyLock:
        """Take this host's lock, then the remote's lease; ``stop`` (a ``threading.Event``) ends the wait
        with :class:`~neuron_build.store.locks.LockCancelled`, holding nothing."""
        self.local.acquire(stop=stop)
        try:
            self.lease = self._take_lease(stop)
        except BaseException:
            self.local.release()
            raise
        self.waited_s = self.local.waited_s + (self.lease.waited_s if self.lease is not None else 0.0)
        self.waited_for = (self.lease.waited_for if self.lease is not None else None) or self.local.waited_for
        self.stale = list(self.local.stale) + (list(self.lease.stale) if self.lease is not None else [])
        self._held = True
        return self

    def _take_lease(self, stop: Any = None) -> Any:
        store = self.store
        if store.unreachable is not None:
            return None
        try:
            lease = store.remote.key_lock(self.key, target=self.target, heartbeat_s=self.heartbeat_s)
            return lease.acquire(stop=stop)
        except (StoreError, OSError) as e:  # as reads of the remote do: fail open
            text = str(e).strip().splitlines()
            why = text[0] if text else type(e).__name__
            if isinstance(e, StoreUnreachable):
                store.mark_unreachable(why)
            else:
                store.warn(f"no compile lease on {store.remote_location} for key {self.key[:16]} ({why}); "
                           "compiling under this host's lock only")
            return None

    def release(self) -> None:
        self._held = False
        lease, self.lease = self.lease, None
        try:
            if lease is not None:
                if self.store.unreachable is not None:
                    lease.abandon()  # no wait on a dark network: it expires by itself
                else:
                    lease.release()
        finally:
            self.local.release()

    def __enter__(self) -> SharedKeyLock:
        return self if self._held else self.acquire()  # (already acquired: just release on exit)

    def __exit__(self, *exc: Any) -> None:
        self.release()


__all__ = ["SharedKeyLock"]
