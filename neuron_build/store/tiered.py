"""The local store as a read-through cache of a shared remote store (``[build] remote``).

Lookups ask the local folder first and the remote second; a build that finds its key only on the remote
downloads the artifact (every blob verified by its sha256) instead of compiling; what a build compiles is
published locally and then pushed (blobs first, the manifest last). Releases and channels live on the
remote, the one set every host shares; target records and results are written to both.

Reads of the remote **fail open**: when the remote cannot be read (endpoint down, credentials missing,
bucket gone) one warning names the URL and the fix and the build goes on with the local store. A push
that fails leaves nothing half-published on the remote, is listed in :attr:`ReadThroughStore.push_failures`
(the build exits 1 and says so), and is retried by the next build or ``neuron-build push``.

The pair is a :class:`~neuron_build.store.core.Store` over the local store's medium, with the local store
as its cache: it overrides only what tiering changes (reads that fall back to the remote, writes that go to
both, publishing then pushing) and takes the store's defaults for the rest, among them the records with a
home tier (failure records: :attr:`local_tier`; releases, channels and their history:
:attr:`shared_tier`, the remote).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from neuron_build.errors import StoreUnreachable
from neuron_build.store import layout
from neuron_build.store.contract import Lookup
from neuron_build.store.core import Store
from neuron_build.store.local import LocalStore
from neuron_build.store.records import TargetRecord
from neuron_build.store.sync import SyncReport, copy_key
from neuron_build.util import json_bytes

T = TypeVar("T")

def one_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class ReadThroughStore(Store):
    """A :class:`~neuron_build.store.local.LocalStore` in front of a remote store; implements
    :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        local: the local store (the cache and the place builds stage and publish).
        remote: the shared store (a :class:`~neuron_build.store.remote.RemoteStore` or any store).
        warn: called with a one-line message when the remote first fails a read (and on other faults of
            the remote that the pair goes on past); default: a log warning.

    Attributes:
        warn: that callable; :class:`~neuron_build.store.shared_lock.SharedKeyLock` warns through it too.
    """

    def __init__(self, local: LocalStore, remote: Store, warn: Callable[[str], None] | None = None):
        super().__init__(local.medium, local.location, local.read_only, cache=local)
        self.local = local
        self.remote = remote
        #: The reason the remote was given up on for reads in this process, or None.
        self.remote_down: str | None = None
        #: The reason the remote was found unreachable (a connection error or a timeout after the
        #: client's retries, :mod:`~neuron_build.store.wire`) in this process, or None: from then on no
        #: call goes to it (pushes are left pending), so a dark network costs a build one bounded wait.
        self.unreachable: str | None = None
        self.warn = warn or _log_warning
        self._pending: set[str] | None = None
        #: blobs this process put in (or verified on) the remote: a later push offers each one no more
        self._sent: set[str] = set()

    # -- the tiers (the contract's Tiers) ----------------------------------------------------------
    @property
    def remote_location(self) -> str:
        return self.remote.location

    @property
    def local_tier(self) -> LocalStore:
        return self.local

    @property
    def remote_tier(self) -> Store:
        return self.remote

    @property
    def shared_tier(self) -> Store:
        """The remote: releases, channels and their history are the ones every host shares."""
        return self.remote

    @property
    def folder(self) -> Path | None:
        return self.local.folder

    def log_file(self, key: str, name: str) -> Path:
        here = self.local.log_file(key, name)
        if here.exists() or self.remote_down is not None:
            return here
        return self._read(lambda: self.remote.log_file(key, name), here)

    # -- failing open ----------------------------------------------------------------------------
    def _read(self, fn: Callable[[], T], default: T) -> T:
        """``fn()`` against the remote; on a store error or OSError warn once and return ``default``."""
        if self.remote_down is not None:
            return default
        try:
            return fn()
        except Exception as e:  # store errors, OSError, botocore errors: all fail open for reads
            self.remote_down = one_line(e)
            if isinstance(e, StoreUnreachable):
                self.unreachable = self.remote_down
            self.warn(f"remote store {self.remote_location} cannot be read ({self.remote_down}); "
                       "going on with the local store only")
            return default

    # -- action cache ----------------------------------------------------------------------------
    def lookup(self, key: str, deep: bool = False) -> Lookup:
        here = self.local.lookup(key, deep)
        if here.hit:
            return replace(here, location="local")
        there = self._read(lambda: self.remote.lookup(key, deep), None)
        if there is not None and there.hit:
            return replace(there, location="remote")
        return here

    def repair(self, key: str, deep: bool = False) -> Lookup:
        here = self.local.repair(key, deep)
        if here.hit:
            if key in self.pending():
                self.push(key)
            return replace(here, location="local")
        there = self._read(lambda: self.remote.lookup(key, deep), None)
        if there is None or not there.hit:
            if there is not None and there.damage is not None and not self.remote.read_only:
                self._read(lambda: self.remote.repair(key, deep), None)  # never served again, by any host
                return here if here.damage is not None else there
            return here
        if self.fetch(key):
            got = self.local.lookup(key)
            if got.hit:
                return replace(got, location="remote")
        return here

    def is_cached(self, key: str) -> bool:
        return self.local.is_cached(key)

    def artifact_dir(self, key: str) -> Path:
        if not self.local.lookup(key).hit:
            self.fetch(key)
        return self.local.artifact_dir(key)

    def keys(self) -> list[str]:
        return sorted(set(self.local.keys()) | set(self._read(self.remote.keys, [])))

    def find_keys(self, prefix: str) -> list[str]:
        return sorted(set(self.local.find_keys(prefix)) | set(self._read(lambda: self.remote.find_keys(prefix), [])))

    def manifests(self) -> Iterator[Any]:
        seen = set()
        for m in self.local.manifests():
            seen.add(m.key)
            yield m
        for m in self._read(lambda: list(self.remote.manifests()), []):
            if m.key not in seen:
                yield m

    def publish(self, folder: Path, key: str, replace: bool = False) -> Path:
        dest = self.local.publish(folder, key, replace)
        self.push(key, replace)
        return dest

    def publish_as(self, folder: Path, key: str, source: str, replace: bool = False) -> Path:
        """:meth:`~neuron_build.store.core.Store.publish_as` into the local store (``source`` must be complete
        there: :meth:`repair` fetches it), then push ``key`` as :meth:`publish` does."""
        dest = self.local.publish_as(folder, key, source, replace)
        self.push(key, replace)
        return dest

    def quarantine(self, key: str, reason: str) -> str | None:
        """Quarantine both copies (the remote's failing open: it is warned about, never raised)."""
        here = self.local.quarantine(key, reason)
        there = None
        if not self.remote.read_only:
            there = self._read(lambda: self.remote.quarantine(key, reason), None)
        return here or there

    def blob_size(self, sha256: str) -> int | None:
        size = self.local.blob_size(sha256)
        return size if size is not None else self._read(lambda: self.remote.blob_size(sha256), None)

    def get_blob(self, sha256: str, dest: Path) -> None:
        try:
            self.local.get_blob(sha256, dest)
        except (FileNotFoundError, ValueError):
            self.remote.get_blob(sha256, dest)

    def put_manifest(self, key: str, raw: dict[str, Any], replace: bool = False) -> bool:
        return self.local.put_manifest(key, raw, replace)

    # -- moving artifacts between the two --------------------------------------------------------
    def fetch(self, key: str) -> bool:
        """Download ``key``'s artifact from the remote into the local store (blobs verified, manifest
        last). Returns True when the local store holds it afterwards; a damaged or unreadable remote copy
        is warned about once and not used."""
        report = SyncReport()
        with tempfile.TemporaryDirectory(prefix="neuron-build-fetch.") as scratch:
            ok = copy_key(self.remote, self.local, key, Path(scratch), report)
        if not ok and report.failed:
            self.warn(f"remote artifact {key[:16]} in {self.remote_location} not used: {report.failed[0][1]}")
        return ok

    def push(self, key: str, replace: bool = False) -> bool:
        """Upload ``key``'s local artifact to the remote (blobs first, manifest last; with ``replace``, a
        rebuild of a stale artifact, the remote's other manifest of ``key`` is replaced). A failure is kept
        in :attr:`push_failures` and in a local marker, so the next build retries it."""
        report = SyncReport()
        if self.unreachable is not None:  # found dark earlier in this process: no second wait
            ok, report.failed = False, [(key, self.unreachable)]
        else:
            report.sent = self._sent  # each blob goes up once per process, however many artifacts name it
            with tempfile.TemporaryDirectory(prefix="neuron-build-push.") as scratch:
                ok = copy_key(self.local, self.remote, key, Path(scratch), report, heal=True, replace=replace)
            if report.unreachable is not None:
                self.mark_unreachable(report.unreachable)
        marker = layout.pending_path(key)
        if ok:
            if key in self.pending():
                self.local.delete_object(marker)
                self.pending().discard(key)
            return True
        reason = report.failed[0][1] if report.failed else "unknown error"
        self.push_failures.append((key, reason))
        self.local.put_object(marker, (reason + "\n").encode())
        self.pending().add(key)
        return False

    def mark_unreachable(self, reason: str) -> None:
        """Give the remote up for the rest of this process (reads and writes; pushes are left pending): it
        could not be reached (``reason``, one line). The first time, :attr:`warn` says so."""
        self.unreachable = reason
        if self.remote_down is None:
            self.remote_down = reason
            self.warn(f"remote store {self.remote_location} cannot be reached ({reason}); going on with the "
                       "local store only (the next build pushes what this one could not)")

    def push_pending(self) -> list[tuple[str, str]]:
        """Retry every push an earlier build on this host left pending. Returns (key, reason) of those
        that failed again (also in :attr:`push_failures`); nothing is attempted while the remote is down."""
        failed = []
        for key in sorted(self.pending()):
            if not self.local.lookup(key).hit:  # collected or damaged here since: nothing left to push
                self.local.delete_object(layout.pending_path(key))
                self.pending().discard(key)
            elif self.remote_down is not None:
                failed.append((key, self.remote_down))
            elif not self.push(key):
                failed.append(self.push_failures[-1])
        return failed

    def pending(self) -> set[str]:
        """Keys built here whose push failed and has not been retried successfully yet."""
        if self._pending is None:
            self._pending = {p.rsplit("/", 1)[-1] for p in self.local.list_objects(layout.PENDING_DIR)}
        return self._pending

    # -- records: written to both, read here first ------------------------------------------------
    def _both(self, write_local: Callable[[], Any], write_remote: Callable[[], Any]) -> None:
        write_local()
        if self.remote_down is None:
            try:
                write_remote()
            except Exception as e:
                self.warn(f"could not write a record to {self.remote_location} ({one_line(e)}); kept locally")

    def _merged(self, here: list[Any], there: list[Any]) -> Iterator[Any]:
        by_id = {r.target: r for r in there}
        by_id.update({r.target: r for r in here})
        for tid in sorted(by_id):
            yield by_id[tid]

    def targets(self, model: str, bucket_id: str | None = None) -> Iterator[TargetRecord]:
        return self._merged(list(self.local.targets(model, bucket_id)),
                            self._read(lambda: list(self.remote.targets(model, bucket_id)), []))

    def all_targets(self) -> Iterator[TargetRecord]:
        return self._merged(list(self.local.all_targets()), self._read(lambda: list(self.remote.all_targets()), []))

    def recorded_imports(self, model: str) -> list[str]:
        return sorted(set(self.local.recorded_imports(model))
                      | set(self._read(lambda: self.remote.recorded_imports(model), [])))

    def add_recorded_imports(self, model: str, files: list[str]) -> list[str]:
        have = self.recorded_imports(model)
        new = self.local.add_recorded_imports(model, sorted(set(have) | set(files)))
        self._both(lambda: None, lambda: self.remote.add_recorded_imports(model, new))
        return new

    def failure_log(self, target_id: str) -> Path:
        return self.local.failure_log(target_id)

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        out = dict(self._read(lambda: self.remote.results(key, kind), {}))
        out.update(self.local.results(key, kind))
        return dict(sorted(out.items()))

    # -- releases and channels: the remote's, shared by every host ---------------------------------
    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        for art in record.get("artifacts") or []:
            key = art.get("key") if isinstance(art, dict) else None
            if isinstance(key, str) and self.local.lookup(key).hit and not self.push(key):
                reason = self.push_failures[-1][1]
                from neuron_build.errors import BuildFailed
                raise BuildFailed(f"release {release_id} not recorded: its artifact {key[:16]} could not be "
                                  f"pushed to {self.remote_location} ({reason}); fix the remote and run it again")
        return self.remote.put_release(model, release_id, record)

    def swap_channel(self, model: str, channel: str, pointer: dict[str, Any], expected: str | None) -> bool:
        """Swap the remote's pointer (the one every host shares) and mirror it into the local store. A local
        channel that the remote's does not account for (made before the remote was added, or moved on this
        host alone) is refused in one line naming both stores: a swap would leave the two disagreeing.

        Raises:
            UserError: the local and the remote channel disagree.
        """
        from neuron_build.store.sync import channel_disagreement
        why = channel_disagreement(self.remote, self.local, model, channel)
        if why is not None:
            from neuron_build.errors import UserError
            raise UserError(why)
        if not self.remote.swap_channel(model, channel, pointer, expected):
            return False
        self._mirror(lambda: self.local.put_object(layout.channel_path(model, channel), json_bytes(pointer)))
        return True

    def put_history_entry(self, model: str, channel: str, entry: dict[str, Any]) -> tuple[str, bytes]:
        """Add the entry to the remote's history, and the same object to the local mirror."""
        rel, data = self.remote.put_history_entry(model, channel, entry)
        self._mirror(lambda: self.local.put_object(rel, data, create_only=True))
        return rel, data

    def _mirror(self, write: Callable[[], Any]) -> None:
        """A best-effort write of the local mirror of a channel (a warning when it fails)."""
        if self.local.read_only:
            return
        try:
            write()
        except Exception as e:
            self.warn(f"could not mirror a channel into {self.location} ({one_line(e)}); the remote's is kept")

    # -- coordination: this host's ----------------------------------------------------------------
    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0) -> Any:
        """This host's lock of ``key``, then the remote's lease (:class:`~.shared_lock.SharedKeyLock`):
        hosts that share the remote compile a key once."""
        from neuron_build.store.shared_lock import SharedKeyLock
        return SharedKeyLock(self, key, target=target, heartbeat_s=heartbeat_s)

    # -- whole objects (ledger entries and the like): written to both, read here first ------------
    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        done = self.local.put_object(path, data, create_only)
        self._both(lambda: None, lambda: self.remote.put_object(path, data, create_only))
        return done

    def get_object(self, path: str) -> bytes | None:
        got = self.local.get_object(path)
        return got if got is not None else self._read(lambda: self.remote.get_object(path), None)

    def list_objects(self, prefix: str) -> list[str]:
        return sorted(set(self.local.list_objects(prefix)) | set(self._read(lambda: self.remote.list_objects(prefix), [])))

    def delete_object(self, path: str) -> bool:
        gone = self.local.delete_object(path)
        self._both(lambda: None, lambda: self.remote.delete_object(path))
        return gone


def _log_warning(message: str) -> None:
    from neuron_build.log import get_logger
    get_logger().warning(message)


__all__ = ["ReadThroughStore", "one_line"]
