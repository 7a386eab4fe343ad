"""The local folder store: :class:`~neuron_build.store.core.Store` over a
:class:`~neuron_build.store.medium.FolderMedium`, plus what is truly local.

The folder holds the layout of :mod:`neuron_build.store.layout` (an action cache ``ac/`` of manifests over a
content-addressed store ``cas/`` of blobs, the records beside them) plus the local-only areas:

    <store>/staging/                     artifacts being written (never read as objects)
    <store>/views/<key[:2]>/<key>/       an artifact's blobs hard-linked (or copied) under their file names,
                                         with a copy of its manifest as ``manifest.json``: what loaders open
    <store>/locks/                       per-key compile locks, the host-memory ledger (locks.py), swap locks
    <store>/trash/                       what gc is deleting (renamed here first)

Publishing (:meth:`~neuron_build.store.core.Store.publish`) stores every file as a blob (temporary name,
fsync, rename; an intact existing blob is kept and touched, a damaged one replaced), the build's logs under
``logs/<key>/``, then the manifest create-only: the manifest is the commit point, so a SIGKILL at any
moment leaves the key complete or absent. The no-op build's fast path is a lookup index validated by file
signatures (:meth:`LocalStore.is_cached`).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.store import layout
from neuron_build.store.core import Store
from neuron_build.store.digests import pid_alive
from neuron_build.store.layout import MANIFEST
from neuron_build.store.medium import FolderMedium
from neuron_build.trust import check_files
from neuron_build.util import fsync_path, read_json, write_atomic


def not_a_folder(path: Path) -> Path | None:
    """The first existing path of ``path`` and the folders above it when it is not a folder (a file, a
    device), else None (``path`` is a folder, or it is missing under a folder)."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


class LocalStore(Store):
    """A store in a local folder (or a shared mount). Implements
    :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        root: the store folder; created on first write.
        read_only: never write (a read-only mount, a deploy host's copy): every writing method raises
            :class:`~neuron_build.store.core.ReadOnlyStore`, and :meth:`repair` reports damage without moving it.

    Raises:
        UserError: ``root`` (or a folder above it) is a file, not a folder; or the folder has the layout of
            neuron-build before the action cache (an ``objects/`` area): no migration; the message says to
            rebuild it or move it aside.
    """

    def __init__(self, root: str | Path, read_only: bool = False):
        self.root = Path(root)
        super().__init__(FolderMedium(self.root), str(self.root), read_only)
        self._root_str = str(self.root)
        self._lookup_index: dict[str, Any] | None = None
        not_folder = not_a_folder(self.root)
        if not_folder is not None:
            what = "is a file" if not_folder == self.root else f"is inside {not_folder}, a file"
            raise UserError(f"store {self.root} {what}, not a folder; set [build] store (buckets.toml) to a folder")
        if (self.root / "objects").is_dir():
            raise UserError(f"store at {self.root} has the old layout (objects/); rebuild it or move it aside "
                            f"(e.g. `mv {self.root} {self.root}.old`, then `neuron-build build`)")

    @property
    def folder(self) -> Path:
        """The store folder."""
        return self.root

    # -- paths: private to the store, public only for tests and the store's own upkeep ---------------
    def path(self, rel: str) -> Path:
        """The local path of a layout path (``cas/ab/ab...``), for tests and :mod:`.verify`."""
        return self.root / rel

    def area(self, name: str) -> Path:
        """The folder of one area of the layout (``ac``, ``cas``, ``staging``, ``quarantine``, ...)."""
        return self.root / name

    def view_dir(self, key: str) -> Path:
        """Where :meth:`artifact_dir` builds the view of ``key`` (``views/<key[:2]>/<key>``)."""
        return self.root / layout.view_dir(key)

    def relative(self, path: Path | None) -> str | None:
        """``path`` relative to the store root, as POSIX text (None stays None)."""
        return path.relative_to(self.root).as_posix() if path is not None else None

    # -- manifests: the commit adds the key to the lookup index ----------------------------------------
    def put_manifest(self, key: str, raw: dict[str, Any], replace: bool = False) -> bool:
        done = super().put_manifest(key, raw, replace)
        if done:
            self._index_add(key, raw)
        return done

    def _committed(self, folder: Path, key: str, text: bytes, files: dict[str, Any]) -> None:
        try:
            fsync_path(self.path(layout.manifest_path(key)).parent)
        except OSError:
            pass

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
            raw = read_json(self.root / layout.LOOKUP_INDEX)
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

        path = self.root / layout.LOOKUP_INDEX
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

    # -- views: blobs hard-linked under their file names --------------------------------------------
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
            self._swap_view(tmp, view, text, files)  # (the one implementation's swap, old view moved aside)
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

    def log_file(self, key: str, name: str) -> Path:
        """Where the build log ``name`` (``worker.log``, ``compile.log``) of ``key``'s artifact is."""
        return self.path(layout.log_path(key, name))

    def failure_log(self, target_id: str) -> Path:
        return self.path(layout.target_path(target_id, "failure.log"))

    # -- staging, locks, the memory budget: this host's ----------------------------------------------
    def new_staging(self, key: str) -> Path:
        self._writable()
        d = self.root / layout.STAGING_DIR / f"{key}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        d.mkdir(parents=True)
        return d

    def staging_owner(self, folder: Path) -> tuple[str, int] | None:
        """(host, pid) of the builder that made a staging folder, from its name; None when not ours."""
        parts = folder.name.split(".")
        if len(parts) < 4 or not parts[-2].isdigit():
            return None
        return parts[-3], int(parts[-2])

    def clean_staging(self) -> int:
        base = self.root / layout.STAGING_DIR
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

    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0):
        from neuron_build.store.locks import KeyLock
        return KeyLock(self.root, key, target=target, heartbeat_s=heartbeat_s)

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0):
        from neuron_build.store.budget import MemoryBudget
        return MemoryBudget(self.root, max_bytes, heartbeat_s=heartbeat_s)


__all__ = ["LocalStore", "not_a_folder"]
