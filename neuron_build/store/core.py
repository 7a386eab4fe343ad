"""The one implementation of :mod:`neuron_build.store.contract`, over a
:class:`~neuron_build.store.medium.Medium`, through :mod:`neuron_build.store.layout` only.

Lookup, repair, publish, quarantine, target and failure records, results, releases, channels and their
history are written once here, as doit's ``dependency.py`` is one class over several databases: the
folder store (:class:`~neuron_build.store.local.LocalStore`) and the URL stores
(:class:`~neuron_build.store.remote.RemoteStore`) differ only in their medium and in what is truly local
(staging, views, file locks, the host-memory budget), which a URL store keeps in a local cache store.

Publishing keeps the order every trusted remote cache uses: every blob create-only, the build's logs,
then the manifest create-only (the commit point); a reader trusts only a manifest whose blobs are present
with their sizes (and, on a deep check, their digests). A blob found already present is *touched* (its
age refreshed) so that a collector running now keeps it, and after the commit the publisher checks its
blobs once more and puts back any that a collector removed meanwhile (it still holds their bytes).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.errors import ExitCode, NeuronBuildError, StoreError
from neuron_build.store import layout
from neuron_build.store.contract import Lookup
from neuron_build.store.digests import check_manifest
from neuron_build.store.layout import MANIFEST
from neuron_build.store.medium import Medium
from neuron_build.store.objects import JsonObjects
from neuron_build.store.publishing import Publishing
from neuron_build.trust import check_files
from neuron_build.util import file_sha256, json_bytes, temp_name, write_atomic

if TYPE_CHECKING:
    from neuron_build.store.manifest import Manifest



class ReadOnlyStore(OSError, NeuronBuildError):
    """A write was asked of a store opened read-only (or on a read-only folder); the command names the
    store and the fix (exit 2)."""

    exit_code = ExitCode.USAGE


class Store(Publishing, JsonObjects):
    """A store over a medium. Implements :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        medium: where the objects are.
        location: a folder path or a URL, for messages.
        read_only: never write: every writing method raises :class:`ReadOnlyStore`; :meth:`repair` only
            reports.
        cache: the local store that holds this store's staging folders, views, log copies and the
            host-memory ledger (None for a local folder store, which is its own).
    """

    def __init__(self, medium: Medium, location: str, read_only: bool = False, cache: Store | None = None):
        self.medium = medium
        self.location = location
        self.read_only = read_only
        self.cache = cache
        #: (key, reason) of artifacts that could not be pushed in this process (a read-through store's).
        self.push_failures: list[tuple[str, str]] = []

    # -- the contract's properties of every store ---------------------------------------------------
    @property
    def remote_location(self) -> str | None:
        """The shared store this one reads through to (a read-through pair's remote), else None."""
        return None

    @property
    def remote_tier(self) -> Any:
        """The shared store of a read-through pair, else None."""
        return None

    @property
    def folder(self) -> Path | None:
        """The store's local folder when it is a folder store, else None."""
        return None

    def pending(self) -> set[str]:
        """Keys built here whose push to a remote has not succeeded yet (none without a remote)."""
        return set()

    def push_pending(self) -> list[tuple[str, str]]:
        """Retry the pending pushes; (key, reason) of those that failed again (none without a remote)."""
        return []

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(errno.EROFS, f"store {self.location} is opened read-only")

    # -- whole objects (ObjectIO) and their versions ------------------------------------------------
    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        self._writable()
        return self.medium.put(path, data, create_only)

    def get_object(self, path: str) -> bytes | None:
        got = self.medium.get(path)
        return None if got is None else got[0]

    def list_objects(self, prefix: str) -> list[str]:
        return self.medium.list(prefix)

    def delete_object(self, path: str) -> bool:
        self._writable()
        return self.medium.delete(path)

    def object_age(self, path: str) -> float | None:
        """Seconds since the object at ``path`` was written or touched, or None when absent or unknown."""
        return self.medium.age(path)

    def object_ref(self, path: str) -> tuple[bytes | None, str | None]:
        """The bytes at ``path`` with their version token (S3: the ETag; else their sha256), or (None, None)."""
        got = self.medium.get(path)
        return (None, None) if got is None else got

    def swap_object(self, path: str, data: bytes, expected: str | None) -> bool:
        """Compare-and-swap of a whole object (None: only when absent); False on a lost race."""
        self._writable()
        return self.medium.swap(path, data, expected)

    def delete_object_if(self, path: str, token: str) -> bool:
        """Delete the object at ``path`` only while its token is ``token``; False otherwise."""
        self._writable()
        return self.medium.delete(path, token)

    # -- blobs ------------------------------------------------------------------------------------
    def blob_size(self, sha256: str) -> int | None:
        return self.medium.size(layout.blob_path(sha256))

    def blob_damage(self, sha256: str, size: int, deep: bool = False) -> str | None:
        """Why blob ``sha256`` cannot serve a file of ``size`` bytes (missing, another size, or with
        ``deep`` another digest), or None when it can. Reads only."""
        have = self.blob_size(sha256)
        if have is None:
            return f"blob {sha256[:16]}... is missing"
        if have != size:
            return f"blob {sha256[:16]}... is {have} bytes, the manifest says {size}"
        if deep:
            try:
                digest = self.medium.hash(layout.blob_path(sha256))
            except StoreError:
                raise
            except OSError as e:
                return f"blob {sha256[:16]}... is unreadable: {e.strerror or e}"
            if digest is None:
                return f"blob {sha256[:16]}... is missing"
            if digest != sha256:
                return f"blob {sha256[:16]}... hashes to {digest[:16]}... (rot or tampering)"
        return None

    def put_blob(self, sha256: str, src: Path) -> bool:
        """Store ``src`` as blob ``sha256`` create-only. An intact existing blob is kept and touched (its
        age refreshed: a collector running now keeps it); one of another size or digest is moved to
        ``quarantine/`` and replaced."""
        self._writable()
        src = Path(src)
        if file_sha256(src) != sha256:
            raise ValueError(f"{src} does not hash to {sha256[:16]}...; not stored as that blob")
        return self._store_blob(sha256, src)

    def get_blob(self, sha256: str, dest: Path) -> None:
        self.get_blobs([(sha256, Path(dest))])

    def get_blobs(self, pairs: list[tuple[str, Path]]) -> None:
        """:meth:`get_blob` of many blobs, fetched concurrently where the medium can.

        Args:
            pairs: (sha256, local destination) each; a destination is written atomically, only once its
                bytes hash to its digest.

        Raises:
            FileNotFoundError: a blob is absent (no destination of that call is left half-written).
            ValueError: a blob's bytes do not hash to its name.
        """
        tmps = [(sha, Path(dest), temp_name(Path(dest))) for sha, dest in pairs]
        try:
            for _, dest, _ in tmps:
                dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                digests = self.medium.get_files([(layout.blob_path(sha), tmp) for sha, _, tmp in tmps])
            except FileNotFoundError:
                missing = [sha for sha, _, _ in tmps if self.blob_size(sha) is None]
                sha = missing[0] if missing else tmps[0][0]
                raise FileNotFoundError(errno.ENOENT, f"blob {sha} is not in the store {self.location}",
                                        layout.blob_path(sha)) from None
            for (sha, _, _), digest in zip(tmps, digests, strict=True):
                if digest != sha:
                    raise ValueError(f"blob {self.location}/{layout.blob_path(sha)} hashes to {digest[:16]}..., "
                                     f"not {sha[:16]}... (rot or tampering)")
            for _, dest, tmp in tmps:
                os.replace(tmp, dest)
        finally:
            for _, _, tmp in tmps:
                tmp.unlink(missing_ok=True)

    # -- the action cache ---------------------------------------------------------------------------
    def put_manifest(self, key: str, raw: dict[str, Any], replace: bool = False) -> bool:
        return self.put_object(layout.manifest_path(key), json_bytes(raw), create_only=not replace)

    def lookup(self, key: str, deep: bool = False) -> Lookup:
        try:
            text = self.get_object(layout.manifest_path(key))
        except StoreError:
            raise
        except OSError as e:
            return Lookup(key, None, f"manifest is unreadable: {e.strerror or e}")
        if text is None:
            return Lookup(key)
        man, damage = check_manifest(text, key)
        if man is None:
            return Lookup(key, None, damage)
        for name, ent in man.files.items():
            why = self.blob_damage(ent.sha256, ent.size, deep)
            if why is not None:
                return Lookup(key, None, f"{name}: {why}", blob=ent.sha256)
        return Lookup(key, man)

    def repair(self, key: str, deep: bool = False) -> Lookup:
        found = self.lookup(key, deep)
        if found.damage is not None and not self.read_only:
            try:
                self.quarantine(key, found.damage)
            except (OSError, StoreError) as e:  # e.g. credentials that may only read: report, never crash
                from neuron_build.log import get_logger
                get_logger(key=key[:12]).warning("damaged object not moved", reason=found.damage, error=str(e))
        return found

    def is_complete(self, key: str, deep: bool = False) -> bool:
        return self.lookup(key, deep).hit

    def is_cached(self, key: str) -> bool:
        return self.is_complete(key)

    def manifest(self, key: str) -> Manifest | None:
        return self.lookup(key).manifest

    def keys(self) -> list[str]:
        out = []
        for rel in self.list_objects(layout.ac_dir()):
            parts = rel.split("/")
            if (len(parts) == 3 and parts[2].endswith(".json") and layout.is_digest(parts[2][:-5])
                    and parts[2][:2] == parts[1]):
                out.append(parts[2][:-5])
        return sorted(out)

    def find_keys(self, prefix: str) -> list[str]:
        names = (rel.rsplit("/", 1)[-1] for rel in self.list_objects(layout.ac_dir(prefix)))
        return sorted(n[:-5] for n in names if n.endswith(".json") and n.startswith(prefix) and layout.is_digest(n[:-5]))

    def manifests(self) -> Iterator[Manifest]:
        for key in self.keys():
            m = self.manifest(key)
            if m is not None:
                yield m

    def _quarantine_object(self, rel: str, name: str, reason: str) -> str | None:
        """Move the object at ``rel`` to ``quarantine/<name>.<token>/`` (a rename where the medium has
        one) and write ``reason.txt`` beside it (best effort on a full disk). None when it was gone."""
        dest = layout.quarantine_dir(name, secrets.token_hex(4))
        inner = MANIFEST if rel.startswith(layout.AC_DIR + "/") else rel.rsplit("/", 1)[-1]
        if not self.medium.move(rel, f"{dest}/{inner}"):
            return None
        try:
            self.medium.put(f"{dest}/reason.txt", (reason + "\n").encode())
        except OSError:
            pass  # e.g. a full disk: the object is out of the way all the same
        from neuron_build.log import get_logger
        get_logger(key=name[:12]).warning("object quarantined", reason=reason, moved_to=f"{self.location}/{dest}")
        return dest

    def quarantine(self, key: str, reason: str) -> str | None:
        """Move ``key``'s manifest (the commit point) to ``quarantine/<key>.<token>/`` with ``reason``; its
        blobs stay (other manifests and releases may pin them; gc collects the unreferenced ones)."""
        self._writable()
        dest = self._quarantine_object(layout.manifest_path(key), key, reason)
        if dest is not None:
            shutil.rmtree(self.view_dir(key), ignore_errors=True)
        return dest

    def quarantine_blob(self, sha256: str, reason: str) -> str | None:
        """Move blob ``sha256`` to ``quarantine/<sha>.<token>/`` with ``reason``; None when absent."""
        self._writable()
        return self._quarantine_object(layout.blob_path(sha256), sha256, reason)

    # -- what a URL store keeps in its local cache (a folder store overrides these) -----------------
    def view_dir(self, key: str) -> Path:
        """Where :meth:`artifact_dir` puts the local copy of ``key`` (``views/<key[:2]>/<key>``)."""
        return self.cache.view_dir(key)

    def _view_fresh(self, view: Path, text: bytes, files: dict[str, Any]) -> bool:
        try:
            if (view / MANIFEST).read_bytes() != text:
                return False
            return all((view / n).stat().st_size == int(e["size"]) for n, e in files.items())
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def artifact_dir(self, key: str) -> Path:
        """A local copy of ``key``'s artifact: its blobs downloaded (digests verified) under their file
        names, and ``manifest.json``, in the cache folder; reused while it matches the stored manifest.

        Raises:
            FileNotFoundError: ``key`` has no manifest. ValueError: a blob does not hash to its name.
        """
        text = self.get_object(layout.manifest_path(key))
        if text is None:
            raise FileNotFoundError(errno.ENOENT, f"no artifact for key {key[:12]} in {self.location}")
        files = check_files(json.loads(text).get("files") or {}, key, self.location)  # names become paths
        view = self.view_dir(key)
        if self._view_fresh(view, text, files):
            return view
        view.parent.mkdir(parents=True, exist_ok=True)
        tmp = view.parent / f".{key}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            self.get_blobs([(e["sha256"], tmp / n) for n, e in files.items()])
            (tmp / MANIFEST).write_bytes(text)
            self._swap_view(tmp, view, text, files)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return view

    def _swap_view(self, tmp: Path, view: Path, text: bytes, files: dict[str, Any]) -> None:
        old = None
        if view.exists():
            old = view.parent / f".{view.name}.old.{os.getpid()}.{secrets.token_hex(4)}"
            os.rename(view, old)
        try:
            os.rename(tmp, view)
        except OSError:
            if old is not None and not view.exists():
                os.rename(old, view)
                old = None
            if not self._view_fresh(view, text, files):  # another process built it meanwhile: fine
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _cached_copy(self, rel: str) -> Path:
        """A local copy (in the cache) of the object at ``rel``; absent when the store has none."""
        local = self.cache.path(rel)
        data = self.get_object(rel)
        if data is None:
            local.unlink(missing_ok=True)
        else:
            write_atomic(local, data)
        return local

    def log_file(self, key: str, name: str) -> Path:
        """A local file of the build log ``name`` of ``key``'s artifact (the artifact's other logs beside
        it); it may not exist when the store has no such log."""
        raw = self.raw_manifest(key) or {}
        for log in sorted(set(raw.get("logs") or {}) | {name}):
            self._cached_copy(layout.log_path(key, log))
        return self.cache.path(layout.log_path(key, name))

    def failure_log(self, target_id: str) -> Path:
        return self._cached_copy(layout.target_path(target_id, "failure.log"))

    def new_staging(self, key: str) -> Path:
        self._writable()
        return self.cache.new_staging(key)

    def clean_staging(self) -> int:
        return self.cache.clean_staging()

    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0) -> Any:
        """The compile lock of ``key`` across hosts: a lease object ``leases/<key>.json``."""
        from neuron_build.store.locks import LeaseLock
        return LeaseLock(self, key, target=target, heartbeat_s=heartbeat_s)

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0) -> Any:
        """The host-memory ledger of this host (in the local cache: host memory is no shared thing)."""
        return self.cache.memory_budget(max_bytes, heartbeat_s=heartbeat_s)


__all__ = ["ReadOnlyStore", "Store"]
