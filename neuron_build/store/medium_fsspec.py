"""The fsspec media: a store at a URL (``memory://name``, ``file:///path``, any fsspec URL; ``s3://`` is
:mod:`neuron_build.store.medium_s3`), the primitives of :class:`~neuron_build.store.medium.Medium` over one
filesystem.

The token of an object is the sha256 of its bytes (S3's is its ETag): ``memory://`` swaps under a process lock, ``file://`` under a file lock (as a folder does); a
filesystem with neither refuses a swap with a clear error rather than risk a lost update.

Every call's exceptions pass through :func:`neuron_build.store.wire_errors.wire` (one-line store errors naming
the URL and the fix).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from neuron_build.errors import StoreError
from neuron_build.store.medium import CHUNK, FolderMedium, Medium, sort_key
from neuron_build.store.wire_errors import is_missing_bucket, wire
from neuron_build.util import commit_temp, file_sha256, fsync_path, sha256_hex, temp_name

_MEMORY_LOCK = threading.RLock()  # memory:// lives in this process: one lock makes its writes atomic


class FsspecMedium(Medium):
    """One fsspec filesystem under ``root``. Public primitives map wire faults (:func:`wire`) and call the
    private ones, which subclasses override.

    Args:
        fs: the filesystem; root: the URL's path (``bucket/prefix`` on S3); url: the URL, for messages;
        endpoint: the endpoint the client talks to, for messages; attempts: per request, for messages.
    """

    def __init__(self, fs: Any, root: str, url: str, endpoint: str | None = None, attempts: int = 4):
        self.fs, self.root, self.url = fs, root.rstrip("/"), url
        self.endpoint, self.attempts = endpoint, attempts
        protos = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
        if type(self) is FsspecMedium:
            self.protocol = protos[0]

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def wire(self, what: str, writing: bool = False):
        return wire(self.url, what, writing, self.endpoint, self.attempts)

    # -- public primitives: wire faults mapped -------------------------------------------------------
    def get(self, rel):
        with self.wire(f"reading {rel}"):
            return self._get(rel)

    def put(self, rel, data, create_only=False):
        with self.wire(f"writing {rel}", writing=True):
            return self._put(rel, data, create_only)

    def put_file(self, rel, src, create_only=False):
        with self.wire(f"uploading {rel}", writing=True):
            return self._put_file(rel, Path(src), create_only)

    def swap(self, rel, data, expected):
        with self.wire(f"swapping {rel}", writing=True):
            return self._swap(rel, data, expected)

    def list(self, prefix):
        with self.wire(f"listing {prefix}/"):
            return self._list(prefix)

    def delete(self, rel, token=None):
        with self.wire(f"deleting {rel}", writing=True):
            return self._delete(rel, token)

    def age(self, rel):
        with self.wire(f"reading the age of {rel}"):
            when = self._modified(rel)
        return None if when is None else max(0.0, time.time() - when)

    def size(self, rel):
        with self.wire(f"reading {rel}"):
            return self._size(rel)

    def touch(self, rel, src):
        with self.wire(f"refreshing {rel}", writing=True):
            return self._touch(rel, Path(src))

    def hash(self, rel):
        h = hashlib.sha256()
        with self.wire(f"reading {rel}"):
            try:
                with self.fs.open(self.full(rel), "rb", block_size=8 * CHUNK) as f:
                    while b := f.read(8 * CHUNK):
                        h.update(b)
            except FileNotFoundError:
                return None
        return h.hexdigest()

    def get_files(self, pairs):
        with self.wire(f"downloading {len(pairs)} object(s)"):
            return self._get_files(pairs)

    def get_many(self, rels):
        if not rels:
            return []
        with self.wire(f"reading {len(rels)} objects under {rels[0].split('/', 1)[0]}/"):
            got = self.fs.cat([self.full(r) for r in rels], on_error="return")
        if not isinstance(got, dict):
            got = {self.full(rels[0]): got}
        out = []
        for r in rels:
            v = got.get(self.full(r), got.get(self.fs._strip_protocol(self.full(r))))
            out.append(v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else None)
        return out

    def move(self, src, dest):
        with self.wire(f"moving {src}", writing=True):
            if self._size(src) is None:
                return False
            self.fs.copy(self.full(src), self.full(dest))
            self._delete(src, None)
            return True

    def find(self, prefix: str) -> list[str]:
        """:meth:`list` without the wire mapping (for tests that look at the filesystem itself)."""
        return self._list(prefix)

    def invalidate(self):
        try:
            self.fs.invalidate_cache()
        except Exception:
            pass

    # -- private primitives of a plain fsspec filesystem -------------------------------------------
    def _get(self, rel):
        try:
            data = self.fs.cat_file(self.full(rel))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return data, sha256_hex(data)

    def _put(self, rel, data, create_only):
        try:
            self.fs.pipe_file(self.full(rel), data, mode="create" if create_only else "overwrite")
        except FileExistsError:
            return False
        return True

    def _put_file(self, rel, src, create_only):
        try:
            self.fs.put_file(str(src), self.full(rel), mode="create" if create_only else "overwrite")
        except FileExistsError:
            return False
        return True

    def _swap(self, rel, data, expected):
        raise StoreError(f"{self.full(rel)}: the {self.protocol} filesystem has no conditional writes, so channels "
                         f"and leases cannot move safely; use an s3:// or file:// store", self.protocol, True)

    def _delete(self, rel, token):
        if token is not None:
            cur = self._get(rel)
            if cur is None or cur[1] != token:
                return False
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            return False
        return True

    def _modified(self, rel):
        try:
            return self.fs.modified(self.full(rel)).timestamp()
        except (FileNotFoundError, NotADirectoryError, NotImplementedError):
            return None

    def _size(self, rel):
        try:
            info = self.fs.info(self.full(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def _touch(self, rel, src):
        if self._size(rel) is None:
            return False
        self._put_file(rel, src, False)
        return True

    def _list(self, prefix):
        try:
            found = self.fs.find(self.full(prefix))
        except FileNotFoundError as e:
            if is_missing_bucket(e):
                raise
            return []
        strip = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        out = []
        for p in found:
            p = self.fs._strip_protocol(p)
            if p.startswith(strip) and not p.rsplit("/", 1)[-1].startswith("."):
                out.append(p[len(strip):])
        return sorted(out, key=sort_key)

    def _get_files(self, pairs):
        out = []
        for rel, dest in pairs:
            self.fs.get_file(self.full(rel), str(dest))
            fsync_path(Path(dest))
            out.append(file_sha256(dest))
        return out


class MemoryMedium(FsspecMedium):
    """``memory://``: one process's dict; a process-wide lock makes create-only writes and swaps atomic."""

    protocol = "memory"

    def _put(self, rel, data, create_only):
        with _MEMORY_LOCK:
            if create_only and self.fs.exists(self.full(rel)):
                return False
            self.fs.pipe_file(self.full(rel), data)
            return True

    def _swap(self, rel, data, expected):
        with _MEMORY_LOCK:
            cur = self._get(rel)
            if (cur[1] if cur else None) != expected:
                return False
            self.fs.pipe_file(self.full(rel), data)
            return True

    def _delete(self, rel, token):
        with _MEMORY_LOCK:
            return super()._delete(rel, token)

    def _put_file(self, rel, src, create_only):
        return self._put(rel, Path(src).read_bytes(), create_only)


class FileUrlMedium(FsspecMedium):
    """``file://``: what a local folder does (:class:`~neuron_build.store.medium.FolderMedium`: temporary
    name, fsync, rename; create-only by hard link; swaps under a file lock), reached through a URL."""

    protocol = "file"

    def __init__(self, fs, root, url, endpoint=None, attempts=4):
        super().__init__(fs, root, url, endpoint, attempts)
        self.folder = FolderMedium(self.root)

    def _put(self, rel, data, create_only):
        return self.folder.put(rel, data, create_only)

    def _put_file(self, rel, src, create_only):
        dest = self.folder.path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        try:  # a copy, never a link: the source is the caller's (a staging file of another store)
            shutil.copyfile(src, tmp)
            fsync_path(tmp)
            return commit_temp(tmp, dest, create_only)
        finally:
            tmp.unlink(missing_ok=True)

    def _swap(self, rel, data, expected):
        return self.folder.swap(rel, data, expected)

    def _touch(self, rel, src):
        return self.folder.touch(rel, src)

    def move(self, src, dest):
        return self.folder.move(src, dest)


def _check_folder(url: str, root: str) -> None:
    """Raise :class:`~neuron_build.errors.StoreIsAFile` when ``root`` (the path of a ``file://`` store) or the
    nearest of its parents that exists is not a folder (a store there could never be written)."""
    p = Path(root)
    for q in (p, *p.parents):
        if os.path.lexists(q):
            if not q.is_dir():
                from neuron_build.errors import StoreIsAFile
                raise StoreIsAFile(url, str(q))
            return


def fsspec_medium(url: str, options: dict[str, Any]) -> FsspecMedium:
    """The medium of a non-S3 URL (``memory://``, ``file://``, any fsspec URL).

    Raises:
        UserError: a URL fsspec cannot open.
        StoreNotOpened: the filesystem connects when made and could not connect (exit 2).
        StoreIsAFile: a ``file://`` URL whose path (or a parent of it) is a file, not a folder (exit 2).
    """
    import fsspec
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError) as e:
        from neuron_build.errors import UserError
        raise UserError(f"{url}: not a store URL fsspec can open ({e}); use s3://bucket/prefix, "
                        f"file:///path or another fsspec URL")
    except OSError as e:  # a filesystem that connects when made (ftp://, sftp://): no such host, refused, timed out
        from neuron_build.errors import StoreNotOpened
        raise StoreNotOpened(url, f"{type(e).__name__}: {str(e).strip() or type(e).__name__}".splitlines()[0]) from e
    protos = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    if "memory" in protos:
        return MemoryMedium(fs, root, url)
    if "file" in protos or "local" in protos:
        _check_folder(url, root)
        return FileUrlMedium(fs, root, url)
    return FsspecMedium(fs, root, url)


__all__ = ["FileUrlMedium", "FsspecMedium", "MemoryMedium", "fsspec_medium"]
