"""The fsspec media: a store at a URL (``s3://bucket/prefix``, ``memory://name``, ``file:///path``, any
fsspec URL), the primitives of :class:`~neuron_build.store.medium.Medium` over one filesystem.

S3 has no rename, so every write is whole and conditional where it matters: create-only writes are
``If-None-Match: *`` (boto3 ``IfNoneMatch="*"``, s3fs ``put_file(..., mode="create")``), swaps are
``If-Match: <etag>`` (boto3; s3fs has no If-Match on writes), a 412 or 409 is a lost race, and a
conditional delete is ``DeleteObject(IfMatch=...)``. On other filesystems the token is the sha256 of the
bytes: ``memory://`` swaps under a process lock, ``file://`` under a file lock (as a folder does); a
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

#: Blobs downloaded at once by :meth:`S3Medium.get_files`.
DOWNLOADS = 8

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


class _held:
    """A lock already acquired, released on exit."""

    def __init__(self, lock: threading.Lock):
        self.lock = lock

    def __enter__(self):
        return self.lock

    def __exit__(self, *exc):
        self.lock.release()


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


class S3Medium(FsspecMedium):
    """``s3://``: s3fs for blobs, listings and reads of many; boto3 for the small objects whose ETag
    matters (``IfNoneMatch="*"`` to create, ``IfMatch=etag`` to swap, ``DeleteObject(IfMatch=...)``), and
    to refresh a blob's ``LastModified`` by copying it onto itself."""

    protocol = "s3"

    def __init__(self, fs, root, url, client, endpoint=None, attempts=4):
        super().__init__(fs, root, url, endpoint, attempts)
        from neuron_build.store.wire import WireSettings
        self.client = client
        fs._nb_sync_client = client  # (transfer: ranged reads in threads)
        #: part sizes and concurrency of large transfers (:mod:`neuron_build.store.transfer`); the store's
        #: :class:`~neuron_build.store.wire.WireSettings` (set by :class:`~neuron_build.store.remote.RemoteStore`)
        self.settings = WireSettings()
        #: the folder of the host's upload locks (:meth:`_host_lock`), or None
        self.lock_dir: Path | None = None
        self.bucket, _, prefix = self.root.partition("/")
        self.prefix = prefix.strip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @staticmethod
    def _code(e: Exception) -> str:
        return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code", ""))

    def _get(self, rel):
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404"):
                return None
            raise
        return r["Body"].read(), r["ETag"]

    def _cond_put(self, rel: str, data: bytes, **cond: str) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data, **cond)
        except Exception as e:
            if self._code(e) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return False
            if cond.get("IfMatch") and self._code(e) in ("NoSuchKey", "404"):
                return False  # the object was deleted meanwhile: the swap lost
            raise
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return True

    def _put(self, rel, data, create_only):
        return self._cond_put(rel, data, **({"IfNoneMatch": "*"} if create_only else {}))

    def _swap(self, rel, data, expected):
        return self._cond_put(rel, data, **({"IfMatch": expected} if expected is not None else {"IfNoneMatch": "*"}))

    def _delete(self, rel, token):
        if self._head(rel) is None:
            return False
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(rel), **({"IfMatch": token} if token else {}))
        except Exception as e:
            if self._code(e) in ("PreconditionFailed", "NoSuchKey", "404", "412"):
                return False
            raise
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return True

    def _put_file(self, rel, src, create_only):
        """One upload per object in this process (a lock per key; a large create-only upload first asks
        whether the object is there); a lost create-only race counts as "already there" once a HEAD finds
        the object, and is tried once more when it does not."""
        from fsspec.asyn import sync

        from neuron_build.store import transfer
        st, key = self.settings, self.key(rel)
        try:
            lock = transfer.key_lock(f"{self.bucket}/{key}")
            waited = not lock.acquire(blocking=False)
            big = src.stat().st_size >= st.multipart_threshold
            with lock if waited else _held(lock), self._host_lock(key if big and create_only else None):
                if create_only and (big or waited) and self._size(rel) is not None:
                    return False  # another thread (a waited lock) or host (a large blob) put it
                for tries in (1, 2):
                    try:
                        sync(self.fs.loop, transfer.upload, self.fs, self.bucket, key, src, st, create_only)
                        return True
                    except transfer.LostRace as e:
                        if self._size(rel) is not None:
                            return False
                        if tries == 2:
                            raise StoreError(f"{self.url}: {e} but nothing is at {rel} (uploading {rel}); retry",
                                             self.url, True) from None
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return False

    def _host_lock(self, key: str | None) -> Any:
        """A file lock of ``key`` in :attr:`lock_dir` (the processes of one host, e.g. a build's workers,
        upload a large blob once: the second waits, then finds it there); nothing without a folder."""
        import contextlib

        if key is None or self.lock_dir is None:
            return contextlib.nullcontext()
        from filelock import FileLock

        self.lock_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.lock_dir / (sha256_hex(f"{self.bucket}/{key}".encode())[:32] + ".lock")))

    def _touch(self, rel, src):
        try:
            self.client.copy_object(Bucket=self.bucket, Key=self.key(rel), MetadataDirective="REPLACE",
                                    CopySource={"Bucket": self.bucket, "Key": self.key(rel)})
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404"):
                return False
            raise
        return True

    def _head(self, rel) -> dict | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def _size(self, rel):
        head = self._head(rel)
        return None if head is None else int(head["ContentLength"])

    def _modified(self, rel):
        head = self._head(rel)
        return None if head is None else head["LastModified"].timestamp()

    def _get_files(self, pairs):
        """All objects concurrently (at most :data:`DOWNLOADS` at once) on s3fs's event loop, each one
        in ranges (:func:`neuron_build.store.transfer.download`: ``max_concurrency`` ranges in flight, shared
        among the objects) written and hashed as they arrive (no second read), then fsynced."""
        if not pairs:
            return []
        from fsspec.asyn import sync

        from neuron_build.store.transfer import RESUME_DIR
        return sync(self.fs.loop, self._download_all, pairs, RESUME_DIR.get())  # (read in the caller's thread)

    async def _download_all(self, pairs, resume=None):
        import asyncio

        from neuron_build.store import transfer
        at_once = min(len(pairs), DOWNLOADS)
        sem = asyncio.Semaphore(at_once)
        ranges = max(1, self.settings.max_concurrency // at_once)

        async def one(rel: str, dest: Path) -> str:
            async with sem:
                return await transfer.download(self.fs, (self.bucket, self.key(rel)), Path(dest),
                                               self.settings.multipart_chunksize, ranges, resume)

        return list(await asyncio.gather(*(one(r, d) for r, d in pairs)))


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


__all__ = ["DOWNLOADS", "FileUrlMedium", "FsspecMedium", "MemoryMedium", "S3Medium", "fsspec_medium"]
