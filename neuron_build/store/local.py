"""The local folder store: the first implementation of :mod:`neuron_build.store.contract`.

The folder holds the layout of :mod:`neuron_build.store.layout` (an action cache ``ac/`` of manifests over a
content-addressed store ``cas/`` of blobs, the records beside them) plus the local-only areas:

    <store>/staging/                     artifacts being written (never read as objects)
    <store>/views/<key[:2]>/<key>/       an artifact's blobs hard-linked (or copied) under their file names,
                                         with a copy of its manifest as ``manifest.json``: what loaders open
    <store>/locks/                       per-key compile locks, the host-memory ledger (locks.py), channel locks
    <store>/trash/                       what gc is deleting (renamed here first)

Publishing an artifact (:meth:`LocalStore.publish`) stores every file as a blob (temporary name, fsync,
rename; an intact existing blob is kept, a damaged one replaced), the build's logs under ``logs/<key>/``
(never pinned: they are not byte-stable), then the manifest create-only: the manifest is the commit point,
so a SIGKILL at any moment leaves the key complete or absent. A failed compile is recorded under its
target, never in ``ac/``.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.errors import UserError
from neuron_build.status import Status
from neuron_build.store import layout
from neuron_build.store.contract import Lookup
from neuron_build.store.layout import MANIFEST
from neuron_build.store.objects import JsonObjects
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.trust import check_files, manifest_problem
from neuron_build.util import (
    canonical_json,
    file_sha256,
    fsync_path,
    json_bytes,
    read_json,
    sha256_hex,
    temp_name,
    write_atomic,
    write_json_atomic,
)

if TYPE_CHECKING:  # pydantic (the manifest model) is imported where a manifest is parsed, never on a no-op
    from neuron_build.store.manifest import Manifest

#: The manifest field holding the sha256 of the manifest's own canonical JSON (without this field).
SELF_DIGEST = "manifest_sha256"
#: Seconds a channel swap waits for the channel's (short) file lock before it counts as a lost race.
CHANNEL_LOCK_TIMEOUT_S = 30.0
#: The lookup index of the no-op fast path (:meth:`LocalStore.is_cached`): local-only, rebuilt by publishing.
LOOKUP_INDEX = "locks/lookup-index.json"


def manifest_digest(raw: dict[str, Any]) -> str:
    """sha256 (64 hex chars) of a manifest's canonical JSON without its :data:`SELF_DIGEST` field."""
    return sha256_hex(canonical_json({k: v for k, v in raw.items() if k != SELF_DIGEST}))


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` running on this host?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_key(name: str) -> bool:
    """Is ``name`` an artifact key (64 lowercase hex chars)?"""
    return layout.is_digest(name)


def check_manifest(text: bytes, key: str) -> tuple[Manifest | None, str | None]:
    """Parse and check a manifest's bytes: (manifest, None) or (None, reason). Reasons name the fault: not
    JSON, not an object, a wrong self digest, another key, invalid fields, a non-PASS status, no files."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        return None, f"manifest is not valid JSON ({e})"
    if not isinstance(raw, dict):
        return None, "manifest is not a JSON object"
    if SELF_DIGEST not in raw:
        return None, f"manifest has no {SELF_DIGEST} of its own (not sealed by neuron-build: not trusted)"
    if raw[SELF_DIGEST] != manifest_digest(raw):
        return None, "manifest does not match its own sha256 (edited or corrupt)"
    if (why := manifest_problem(raw)) is not None:  # the trust boundary: names become paths only after it
        return None, f"manifest is refused: {why}"
    if raw.get("key") != key:
        return None, f"manifest names key {str(raw.get('key'))[:16]!r}, not this entry's key"
    from pydantic import ValidationError

    from neuron_build.store.manifest import Manifest

    try:
        man = Manifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        return None, f"manifest is invalid: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    if man.metrics.status != Status.PASS:
        return None, f"manifest status is {man.metrics.status}, not PASS"
    if not man.files:
        return None, "manifest lists no files"
    return man, None


def not_a_folder(path: Path) -> Path | None:
    """The first existing path of ``path`` and the folders above it when it is not a folder (a file, a
    device), else None (``path`` is a folder, or it is missing under a folder)."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


class ReadOnlyStore(OSError):
    """A write was asked of a store opened read-only (or on a read-only folder)."""


class LocalStore(JsonObjects):
    """A store in a local folder (or a shared mount). Implements
    :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        root: the store folder; created on first write.
        read_only: never write (a read-only mount, a deploy host's copy): every writing method raises
            :class:`ReadOnlyStore`, and :meth:`repair` reports damage without moving it.

    Attributes:
        read_only: as given (an addition to the contract: callers may check it).

    Raises:
        UserError: ``root`` (or a folder above it) is a file, not a folder; or the folder has the layout of
            neuron-build before the action cache (an ``objects/`` area): no migration; the message says to
            rebuild it or move it aside.
    """

    def __init__(self, root: str | Path, read_only: bool = False):
        self.root = Path(root)
        self.location = self._root_str = str(self.root)
        self.read_only = read_only
        self._lookup_index: dict[str, Any] | None = None
        not_folder = not_a_folder(self.root)
        if not_folder is not None:
            what = "is a file" if not_folder == self.root else f"is inside {not_folder}, a file"
            raise UserError(f"store {self.root} {what}, not a folder; set [build] store (buckets.toml) or "
                            f"--store to a folder")
        if (self.root / "objects").is_dir():
            raise UserError(f"store at {self.root} has the old layout (objects/); rebuild it or move it aside "
                            f"(e.g. `mv {self.root} {self.root}.old`, then `neuron-build build`)")

    # -- paths: private to the store, public only for tests and the store's own upkeep ---------------
    def path(self, rel: str) -> Path:
        """The local path of a layout path (``cas/ab/ab...``), for tests and :mod:`.maintenance`."""
        return self.root / rel

    def area(self, name: str) -> Path:
        """The folder of one area of the layout (``ac``, ``cas``, ``staging``, ``quarantine``, ...), for
        :mod:`neuron_build.store.maintenance`."""
        return self.root / name

    def view_dir(self, key: str) -> Path:
        """Where :meth:`artifact_dir` builds the view of ``key`` (``views/<key[:2]>/<key>``)."""
        return self.root / "views" / key[:2] / key

    def relative(self, path: Path | None) -> str | None:
        """``path`` relative to the store root, as POSIX text (None stays None)."""
        return path.relative_to(self.root).as_posix() if path is not None else None

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(errno.EROFS, f"store {self.root} is opened read-only")

    # -- blobs ------------------------------------------------------------------------------------
    def blob_size(self, sha256: str) -> int | None:
        try:
            return os.stat(self.path(layout.blob_path(sha256))).st_size
        except OSError:
            return None

    def blob_damage(self, sha256: str, size: int, deep: bool = False) -> str | None:
        """Why blob ``sha256`` cannot serve a file of ``size`` bytes (missing, another size, or with
        ``deep`` another digest), or None when it can. Reads only."""
        p = self.path(layout.blob_path(sha256))
        try:
            have = os.stat(p).st_size
        except OSError:
            return f"blob {sha256[:16]}... is missing"
        if have != size:
            return f"blob {sha256[:16]}... is {have} bytes, the manifest says {size}"
        if deep:
            try:
                digest = file_sha256(p)
            except OSError as e:
                return f"blob {sha256[:16]}... is unreadable: {e.strerror or e}"
            if digest != sha256:
                return f"blob {sha256[:16]}... hashes to {digest[:16]}... (rot or tampering)"
        return None

    def put_blob(self, sha256: str, src: Path) -> bool:
        self._writable()
        src = Path(src)
        if file_sha256(src) != sha256:
            raise ValueError(f"{src} does not hash to {sha256[:16]}...; not stored as that blob")
        dest = self.path(layout.blob_path(sha256))
        size = src.stat().st_size
        if dest.exists():
            if self.blob_damage(sha256, size, deep=True) is None:
                try:
                    os.utime(dest)  # a young blob is not collected by a gc running now
                except OSError:
                    pass
                return False
            self.quarantine_path(dest, f"blob {sha256} did not match its digest; replaced by a new copy")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        try:
            try:
                os.link(src, tmp)  # the staging file becomes the blob: no copy of a large NEFF
            except OSError:
                shutil.copyfile(src, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.chmod(tmp, 0o444)  # blobs are immutable; views hard-link them
            except OSError:
                pass
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fsync_path(dest.parent)
        except OSError:
            pass
        return True

    def get_blob(self, sha256: str, dest: Path) -> None:
        import hashlib

        src = self.path(layout.blob_path(sha256))
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        h = hashlib.sha256()
        try:
            try:
                fi = open(src, "rb")
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundError(errno.ENOENT, f"blob {sha256} is not in the store", str(src)) from None
            with fi, open(tmp, "wb") as fo:
                while b := fi.read(1 << 20):
                    h.update(b)
                    fo.write(b)
                fo.flush()
                os.fsync(fo.fileno())
            if h.hexdigest() != sha256:
                raise ValueError(f"blob {src} hashes to {h.hexdigest()[:16]}..., not {sha256[:16]}... "
                                 f"(rot or tampering)")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    # -- manifests --------------------------------------------------------------------------------
    def put_manifest(self, key: str, raw: dict[str, Any]) -> bool:
        self._writable()
        done = write_atomic(self.path(layout.manifest_path(key)), json_bytes(raw), create_only=True)
        if done:
            self._index_add(key, raw)
        return done

    # -- the lookup index: the no-op build's fast path ---------------------------------------------
    def _signature(self, key: str, shas: list[str]) -> list[list[int]] | None:
        """(size, mtime_ns, ctime_ns, inode) of ``key``'s manifest and (size, mtime_ns, inode) of each
        blob (not ctime: hard-linking a blob into a view changes it), or None when one is missing. A
        rewrite, rename or replacement of any of them changes the signature."""
        base = self._root_str  # plain strings: this runs once per target on every no-op build
        try:
            st = os.stat(f"{base}/{layout.manifest_path(key)}")
            out = [[st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]]
            for sha in shas:
                st = os.stat(f"{base}/{layout.blob_path(sha)}")
                out.append([st.st_size, st.st_mtime_ns, st.st_ino])
        except OSError:
            return None
        return out

    def _index(self) -> dict[str, Any]:
        """The lookup index (``locks/lookup-index.json``: key -> [blob digests, signature]), read once."""
        if self._lookup_index is None:
            raw = read_json(self.root / LOOKUP_INDEX)
            self._lookup_index = raw if isinstance(raw, dict) else {}
        return self._lookup_index

    def _index_add(self, key: str, raw: dict[str, Any]) -> None:
        """Record the signature of a manifest just committed (after a full check of its blobs). Best
        effort: a store without an index entry is checked the slow way."""
        shas = [e["sha256"] for e in (raw.get("files") or {}).values() if isinstance(e, dict) and "sha256" in e]
        sig = self._signature(key, shas)
        if sig is None or not self.lookup(key).hit:
            return
        from filelock import FileLock

        path = self.root / LOOKUP_INDEX
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(path) + ".lock", timeout=30):
                cur = read_json(path)
                cur = cur if isinstance(cur, dict) else {}
                if len(cur) % 512 == 511:  # now and then, forget keys that left the action cache
                    cur = {k: v for k, v in cur.items() if self.path(layout.manifest_path(k)).exists()}
                cur[key] = [shas, sig]
                write_atomic(path, json.dumps(cur, separators=(",", ":")).encode())
                self._lookup_index = cur
        except OSError:
            pass

    def is_cached(self, key: str) -> bool:
        """Is the artifact of ``key`` complete in this folder? The doit no-op's check: when the lookup
        index holds the key and the manifest and every blob still have the signature (size, mtime, ctime,
        inode) they had when the manifest was committed and checked, no manifest is parsed; otherwise the
        full :meth:`lookup` decides. Reads only."""
        ent = self._index().get(key)
        if isinstance(ent, list) and len(ent) == 2 and self._signature(key, ent[0]) == ent[1]:
            return True
        return self.lookup(key).hit

    # -- action cache -------------------------------------------------------------------------------
    def lookup(self, key: str, deep: bool = False) -> Lookup:
        try:
            text = self.path(layout.manifest_path(key)).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return Lookup(key)
        except OSError as e:
            return Lookup(key, None, f"manifest is unreadable: {e.strerror or e}")
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
            except OSError as e:  # a folder we cannot write after all: report, never crash a read
                from neuron_build.log import get_logger
                get_logger(key=key[:12]).warning("damaged object not moved", reason=found.damage, error=str(e))
        return found

    def is_complete(self, key: str, deep: bool = False) -> bool:
        return self.lookup(key, deep).hit

    def manifest(self, key: str) -> Manifest | None:
        return self.lookup(key).manifest

    def artifact_dir(self, key: str) -> Path:
        """The view of ``key``: its blobs hard-linked (copied where linking fails) under their file names,
        and ``manifest.json``. Built on first use and rebuilt when stale (another manifest, a blob replaced
        since). On a read-only store a view that is not there yet is built in a private temporary folder.

        Raises:
            FileNotFoundError: ``key`` has no manifest (call after a hit).
        """
        text = self.get_object(layout.manifest_path(key))
        if text is None:
            raise FileNotFoundError(errno.ENOENT, f"no artifact for key {key[:12]} in {self.root}")
        files = check_files(json.loads(text).get("files") or {}, key, str(self.root))  # names become paths
        view = self.view_dir(key)
        if self._view_fresh(view, text, files):
            return view
        if self.read_only:
            return self._build_view(Path(tempfile.mkdtemp(prefix=f"neuron-build-view-{key[:12]}-")), text, files)
        view.parent.mkdir(parents=True, exist_ok=True)
        tmp = view.parent / f".{key}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            self._build_view(tmp, text, files)
            old = None
            if view.exists():
                old = view.parent / f".{key}.old.{os.getpid()}.{secrets.token_hex(4)}"
                os.rename(view, old)
            try:
                os.rename(tmp, view)
            except OSError:
                if old is not None and not view.exists():
                    os.rename(old, view)
                if not self._view_fresh(view, text, files):  # another process built it meanwhile: fine
                    raise
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return view

    def _build_view(self, folder: Path, text: bytes, files: dict[str, Any]) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        how = {}
        for name, ent in files.items():
            dst = folder / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = self.path(layout.blob_path(ent["sha256"]))
            try:
                os.link(src, dst)
                how[name] = "link"
            except OSError:
                shutil.copyfile(src, dst)
                how[name] = "copy"
        (folder / MANIFEST).write_bytes(text)
        (folder / ".view.json").write_text(json.dumps(how))
        return folder

    def _view_fresh(self, view: Path, text: bytes, files: dict[str, Any]) -> bool:
        try:
            if (view / MANIFEST).read_bytes() != text:
                return False
            how = json.loads((view / ".view.json").read_text())
            for name, ent in files.items():
                st = os.stat(view / name)
                if st.st_size != ent["size"]:
                    return False
                if how.get(name) == "link":
                    b = os.stat(self.path(layout.blob_path(ent["sha256"])))
                    if (b.st_ino, b.st_dev) != (st.st_ino, st.st_dev):
                        return False
        except (OSError, ValueError, AttributeError):
            return False
        return True

    def keys(self) -> list[str]:
        base = self.root / "ac"
        if not base.is_dir():
            return []
        return sorted(p.stem for sub in base.iterdir() if sub.is_dir()
                      for p in sub.glob("*.json") if is_key(p.stem) and p.stem[:2] == sub.name)

    def find_keys(self, prefix: str) -> list[str]:
        base = self.root / "ac" / prefix[:2]
        return sorted(p.stem for p in base.glob(prefix + "*.json") if is_key(p.stem)) if base.is_dir() else []

    def manifests(self) -> Iterator[Manifest]:
        for key in self.keys():
            m = self.manifest(key)
            if m is not None:
                yield m

    def log_file(self, key: str, name: str) -> Path:
        """Where the build log ``name`` (``worker.log``, ``compile.log``) of ``key``'s artifact is."""
        return self.path(layout.log_path(key, name))

    def new_staging(self, key: str) -> Path:
        self._writable()
        d = self.root / "staging" / f"{key}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        d.mkdir(parents=True)
        return d

    def seal(self, folder: Path, manifest: Manifest) -> dict[str, Any]:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            fsync_path(f)
        raw = manifest.model_dump(mode="json")
        raw[SELF_DIGEST] = manifest_digest(raw)
        write_atomic(folder / MANIFEST, (json.dumps(raw, indent=2) + "\n").encode())
        fsync_path(folder)
        return raw

    def publish(self, folder: Path, key: str) -> Path:
        """Store a sealed folder's files as blobs, its logs under ``logs/<key>/``, then its manifest
        (create-only, the commit point). A complete artifact already there is kept (the folder is
        discarded); a damaged manifest in the way is quarantined first.

        Returns:
            :meth:`artifact_dir` of ``key``.

        Raises:
            OSError: e.g. ENOSPC, or a read-only store; the key is not committed.
            ValueError: the folder has no readable manifest, or a file does not match it.
        """
        self._writable()
        folder = Path(folder)
        raw = json.loads((folder / MANIFEST).read_bytes())
        if not isinstance(raw, dict) or raw.get("key") != key:
            raise ValueError(f"{folder / MANIFEST} is not the manifest of key {key[:12]}")
        found = self.lookup(key)
        if not found.hit:
            if found.damage is not None:
                self.quarantine(key, found.damage)
            for name, ent in (raw.get("files") or {}).items():
                self.put_blob(ent["sha256"], folder / name)
            for name in raw.get("logs") or {}:
                src = folder / name
                if src.is_file():
                    write_atomic(self.log_file(key, name), src.read_bytes())
            if not self.put_manifest(key, raw) and not self.is_complete(key):
                # a damaged entry appeared between our check and our commit: move it, commit again
                self.repair(key)
                if not self.put_manifest(key, raw):
                    raise OSError(errno.EEXIST, f"could not commit {layout.manifest_path(key)}: another writer "
                                                f"keeps replacing it")
            try:
                fsync_path(self.path(layout.manifest_path(key)).parent)
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
        return self.artifact_dir(key)

    def quarantine(self, key: str, reason: str) -> str | None:
        """Move ``key``'s manifest (the commit point) to ``quarantine/<key>.<token>/`` with ``reason``;
        its blobs stay (other manifests and releases may pin them; gc collects the unreferenced ones)."""
        self._writable()
        moved = self.quarantine_path(self.path(layout.manifest_path(key)), reason, key)
        view = self.view_dir(key)
        if moved is not None and view.exists():
            shutil.rmtree(view, ignore_errors=True)
        return self.relative(moved)

    def quarantine_blob(self, sha256: str, reason: str) -> str | None:
        """Move blob ``sha256`` to ``quarantine/<sha>.<token>/`` with ``reason``; None when absent."""
        self._writable()
        return self.relative(self.quarantine_path(self.path(layout.blob_path(sha256)), reason))

    def quarantine_path(self, src: Path, reason: str, key: str | None = None) -> Path | None:
        """Move any entry of the store (a manifest, a blob, a stray file) to ``quarantine/<name>.<token>/``
        with one atomic rename, then write ``reason.txt`` beside it (best effort on a full disk).

        Returns:
            The quarantine folder, or None when ``src`` was already gone (another process moved it).
        """
        self._writable()
        if not os.path.lexists(src):
            return None
        name = src.name[:-5] if src.name.endswith(".json") and is_key(src.name[:-5]) else src.name
        dest = self.root / "quarantine" / f"{name}.{secrets.token_hex(4)}"
        dest.mkdir(parents=True)
        inner = dest / ("manifest.json" if name != src.name else src.name)
        try:
            os.rename(src, inner)
        except FileNotFoundError:
            dest.rmdir()
            return None  # another process moved it first
        try:
            (dest / "reason.txt").write_text(reason + "\n")
        except OSError:
            pass  # e.g. a full disk: the object is out of the way all the same
        from neuron_build.log import get_logger
        get_logger(key=(key or name)[:12]).warning("object quarantined", reason=reason, moved_to=str(dest))
        return dest

    def staging_owner(self, folder: Path) -> tuple[str, int] | None:
        """(host, pid) of the builder that made a staging folder, from its name; None when not ours."""
        parts = folder.name.split(".")
        if len(parts) < 4 or not parts[-2].isdigit():
            return None
        return parts[-3], int(parts[-2])

    def clean_staging(self) -> int:
        base = self.root / "staging"
        if self.read_only or not base.is_dir():
            return 0
        host = socket.gethostname()
        n = 0
        for d in base.iterdir():
            owner = self.staging_owner(d)
            if owner is None or owner[0] != host:
                continue
            if owner[1] != os.getpid() and not pid_alive(owner[1]):
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n

    # -- records ----------------------------------------------------------------------------------
    def _put_json(self, rel: str, obj: Any, create_only: bool = False) -> bool:
        self._writable()
        return write_json_atomic(self._object_file(rel), obj, create_only=create_only)  # refuses '..', '/x'

    def put_target(self, record: TargetRecord) -> None:
        self._put_json(layout.target_path(record.target), record.to_json())

    def target(self, target_id: str) -> TargetRecord | None:
        return TargetRecord.from_json(read_json(self.path(layout.target_path(target_id))))

    def _records(self, name: str, model: str | None, bucket_id: str | None) -> Iterator[tuple[str, Any]]:
        base = self.root / "targets"
        if model is not None:
            base = base / model
            if bucket_id is not None:
                base = base / bucket_id
        if not base.is_dir():
            return
        top = self.root / "targets"
        found = [os.path.join(d, name) for d, _, files in os.walk(base) if name in files]  # faster than rglob
        for f in sorted(found, key=lambda x: x.split(os.sep)):  # the order of sorted(Path, ...)
            yield Path(os.path.relpath(os.path.dirname(f), top)).as_posix(), read_json(Path(f))

    def put_failure(self, record: FailureRecord, log: bytes) -> None:
        self._writable()
        write_atomic(self.path(layout.target_path(record.target, "failure.log")), log)
        self._put_json(layout.target_path(record.target, "failure.json"), record.to_json())

    def failure(self, target_id: str) -> FailureRecord | None:
        return FailureRecord.from_json(read_json(self.path(layout.target_path(target_id, "failure.json"))))

    def failures(self, model: str, bucket_id: str | None = None) -> Iterator[FailureRecord]:
        for _, raw in self._records("failure.json", model, bucket_id):
            rec = FailureRecord.from_json(raw)
            if rec is not None:
                yield rec

    def failure_log(self, target_id: str) -> Path:
        return self.path(layout.target_path(target_id, "failure.log"))

    def clear_failure(self, target_id: str) -> None:
        for name in ("failure.json", "failure.log"):
            p = self.path(layout.target_path(target_id, name))
            if p.exists():
                self._writable()
                p.unlink(missing_ok=True)

    def put_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> None:
        self._put_json(layout.result_path(key, kind, name), result)

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        return read_json(self.path(layout.result_path(key, kind, name)))

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        base = self.root / "results" / key / kind
        if not base.is_dir():
            return {}
        return {p.stem: r for p in sorted(base.glob("*.json")) if (r := read_json(p)) is not None}

    # -- releases and channels ------------------------------------------------------------------------
    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        return self._put_json(layout.release_path(model, release_id), record, create_only=True)

    def release(self, model: str, release_id: str) -> dict[str, Any] | None:
        return read_json(self.path(layout.release_path(model, release_id)))

    def release_ids(self, model: str, prefix: str = "") -> list[str]:
        d = self.root / "releases" / model
        return sorted(p.stem for p in d.glob(f"{prefix}*.json") if not p.name.startswith(".")) if d.is_dir() else []

    def releases(self, model: str | None = None) -> Iterator[tuple[str, str, Any]]:
        base = self.root / "releases"
        if not base.is_dir():
            return
        for d in sorted(base.iterdir()) if model is None else [base / model]:
            for p in sorted(d.glob("*.json")) if d.is_dir() else []:
                if not p.name.startswith("."):
                    yield d.name, p.stem, read_json(p)

    def channel(self, model: str, channel: str) -> dict[str, Any] | None:
        return read_json(self.path(layout.channel_path(model, channel)))

    def channels(self) -> Iterator[tuple[str, str, Any]]:
        base = self.root / "channels"
        for p in sorted(base.glob("*/*.json")) if base.is_dir() else []:
            if not p.name.startswith(".") and p.is_file():
                yield p.parent.name, p.stem, read_json(p)

    def channel_ref(self, model: str, channel: str) -> tuple[dict[str, Any] | None, str | None]:
        """The pointer and its version token: the sha256 of the pointer file's bytes. An unparsable
        pointer reads as (None, token), so a swap may replace it."""
        data = self.get_object(layout.channel_path(model, channel))
        if data is None:
            return None, None
        try:
            ptr = json.loads(data)
        except ValueError:
            ptr = None
        return (ptr if isinstance(ptr, dict) else None), sha256_hex(data)

    def swap_channel(self, model: str, channel: str, pointer: dict[str, Any], expected: str | None) -> bool:
        """Compare-and-swap under a short file lock (``locks/channels/<model>/<channel>.lock``): the pointer
        is replaced (temporary file, fsync, rename) only when its token is still ``expected``. A lock held
        longer than :data:`CHANNEL_LOCK_TIMEOUT_S` counts as a lost race."""
        from filelock import FileLock, Timeout

        self._writable()
        lock_path = self.root / "locks" / "channels" / model / f"{channel}.lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(lock_path), timeout=CHANNEL_LOCK_TIMEOUT_S):
                _, token = self.channel_ref(model, channel)
                if token != expected:
                    return False
                write_atomic(self.path(layout.channel_path(model, channel)), json_bytes(pointer))
                return True
        except Timeout:
            return False

    def append_history(self, model: str, channel: str, entry: dict[str, Any]) -> None:
        """Write ``entry`` as a new object ``<history_dir>/<UTC time>-<token>.json`` (create-only): two
        writers never overwrite each other, and names sort by time."""
        stamp = utc_now_us()
        data = json.dumps(entry, sort_keys=False, default=str).encode() + b"\n"
        while not self.put_object(f"{layout.history_dir(model, channel)}/{stamp}-{secrets.token_hex(4)}.json",
                                  data, create_only=True):
            pass  # a token collision: draw another

    def history(self, model: str, channel: str) -> list[dict[str, Any]]:
        out = []
        for rel in self.list_objects(layout.history_dir(model, channel)):
            try:
                e = json.loads(self.path(rel).read_bytes())
            except (OSError, ValueError):
                continue
            if isinstance(e, dict):
                out.append(e)
        return out

    # -- builders that share the store ----------------------------------------------------------------
    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0):
        from neuron_build.store.locks import KeyLock
        return KeyLock(self.root, key, target=target, heartbeat_s=heartbeat_s)

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0):
        from neuron_build.store.locks import MemoryBudget
        return MemoryBudget(self.root, max_bytes, heartbeat_s=heartbeat_s)

    # -- ObjectIO ---------------------------------------------------------------------------------------
    def _object_file(self, path: str) -> Path:
        """The file of the object at the relative POSIX ``path``.

        Raises:
            ValueError: ``path`` is absolute, empty or leaves the store (``..``).
        """
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"object path {path!r} is not a relative path inside the store")
        return self.root.joinpath(*parts)

    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        self._writable()
        f = self._object_file(path)
        for _ in range(3):  # a concurrent delete_object may remove the (empty) folder between mkdir and open
            try:
                return write_atomic(f, data, create_only=create_only)
            except FileNotFoundError:
                continue
        return write_atomic(f, data, create_only=create_only)

    def get_object(self, path: str) -> bytes | None:
        try:
            return self._object_file(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def list_objects(self, prefix: str) -> list[str]:
        base = self._object_file(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))  # hidden: temporary files

    def delete_object(self, path: str) -> bool:
        self._writable()
        f = self._object_file(path)
        try:
            f.unlink()
        except FileNotFoundError:
            return False
        d = f.parent
        while d != self.root:  # drop folders the delete left empty (an object store has no folders)
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent
        return True


def utc_now_us() -> str:
    """The current UTC time as ``20261201T094403.123456Z``: history entry names sort by it."""
    import datetime as _dt
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


__all__ = ["LocalStore", "ReadOnlyStore", "SELF_DIGEST", "check_manifest", "is_key", "manifest_digest",
           "pid_alive", "utc_now_us"]
