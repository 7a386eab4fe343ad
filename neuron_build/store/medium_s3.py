"""The ``s3://`` medium: :class:`S3Medium`, the primitives of :class:`~neuron_build.store.medium.Medium` on S3 over
s3fs (blobs, listings, reads of many; large objects through :mod:`neuron_build.store.transfer` and
:mod:`neuron_build.store.ranged`) and boto3 (the small objects whose ETag matters, refreshes by copy).

S3 has no rename, so every write is whole and conditional where it matters: create-only writes are
``If-None-Match: *``, swaps are ``If-Match: <etag>`` (boto3; s3fs has no If-Match on writes), a 412 or 409 is
a lost race, and a conditional delete is ``DeleteObject(IfMatch=...)``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from neuron_build.errors import StoreError
from neuron_build.store.medium_fsspec import FsspecMedium
from neuron_build.util import sha256_hex

#: Blobs downloaded at once by :meth:`S3Medium.get_files`.
DOWNLOADS = 8
_RACED_LOCK = threading.Lock()


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
        #: objects a create-only upload found put by a concurrent writer (:meth:`lost_race`)
        self._raced: set[str] = set()
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
        the object, and is tried once more when it does not. An object found there after waiting for another
        writer of this process or host, or put by the writer that won the race, is noted for
        :meth:`lost_race`."""
        from fsspec.asyn import sync

        from neuron_build.store import transfer
        st, key = self.settings, self.key(rel)
        self._raced.discard(rel)
        try:
            lock = transfer.key_lock(f"{self.bucket}/{key}")
            waited = not lock.acquire(blocking=False)
            big = src.stat().st_size >= st.multipart_threshold
            with lock if waited else _held(lock), self._host_lock(key if big and create_only else None) as other:
                if create_only and (big or waited) and self._size(rel) is not None:
                    if waited or other:  # another thread (a waited lock) or process of this host put it just now
                        self._raced.add(rel)
                    return False
                for tries in (1, 2):
                    try:
                        sync(self.fs.loop, transfer.upload, self.fs, self.bucket, key, src, st, create_only)
                        return True
                    except transfer.LostRace as e:
                        if self._size(rel) is not None:
                            if big:  # (it was not there before: a small blob is not asked for first)
                                self._raced.add(rel)
                            return False
                        if tries == 2:
                            raise StoreError(f"{self.url}: {e} but nothing is at {rel} (uploading {rel}); retry",
                                             self.url, True) from None
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return False

    def lost_race(self, rel):
        with _RACED_LOCK:
            if rel in self._raced:
                self._raced.discard(rel)
                return True
        return False

    @contextlib.contextmanager
    def _host_lock(self, key: str | None) -> Iterator[bool]:
        """A file lock of ``key`` in :attr:`lock_dir` (the processes of one host, e.g. a build's workers,
        upload a large blob once: the second waits, then finds it there); nothing without a folder. Yields
        whether it waited for another process."""
        if key is None or self.lock_dir is None:
            yield False
            return
        from filelock import FileLock, Timeout

        self.lock_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.lock_dir / (sha256_hex(f"{self.bucket}/{key}".encode())[:32] + ".lock")))
        try:
            lock.acquire(timeout=0)
            waited = False
        except Timeout:
            lock.acquire()
            waited = True
        try:
            yield waited
        finally:
            lock.release()

    def _touch(self, rel, src):
        """Copy the object onto itself (a new ``LastModified``): one ``CopyObject`` below
        ``multipart_copy_threshold`` bytes (S3 copies at most 5 GB so), else boto3's managed copy, a multipart
        copy of ``UploadPartCopy`` parts (s3transfer: a HEAD for the size, the parts concurrently)."""
        key, st = self.key(rel), self.settings
        where = {"Bucket": self.bucket, "Key": key}
        try:
            size = Path(src).stat().st_size  # (the same bytes as the object's: the caller checked its size)
        except OSError:
            size = None
        try:
            if size is not None and size < st.multipart_copy_threshold:
                self.client.copy_object(**where, MetadataDirective="REPLACE", CopySource=dict(where))
            else:
                from boto3.s3.transfer import TransferConfig

                from neuron_build.store.transfer import part_size
                cfg = TransferConfig(multipart_threshold=st.multipart_copy_threshold, max_concurrency=st.max_concurrency,
                                     multipart_chunksize=part_size(size or 0, st.multipart_chunksize))
                self.client.copy(dict(where), self.bucket, key, ExtraArgs={"MetadataDirective": "REPLACE"}, Config=cfg)
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
        in ranges (:func:`neuron_build.store.ranged.download`: ``max_concurrency`` ranges in flight, shared
        among the objects) written and hashed as they arrive (no second read), then fsynced."""
        if not pairs:
            return []
        from fsspec.asyn import sync

        from neuron_build.store.ranged import RESUME_DIR
        return sync(self.fs.loop, self._download_all, pairs, RESUME_DIR.get())  # (read in the caller's thread)

    async def _download_all(self, pairs, resume=None):
        import asyncio

        from neuron_build.store import ranged
        at_once = min(len(pairs), DOWNLOADS)
        sem = asyncio.Semaphore(at_once)
        ranges = max(1, self.settings.max_concurrency // at_once)

        async def one(rel: str, dest: Path) -> str:
            async with sem:
                return await ranged.download(self.fs, (self.bucket, self.key(rel)), Path(dest),
                                               self.settings.multipart_chunksize, ranges, resume)

        return list(await asyncio.gather(*(one(r, d) for r, d in pairs)))


class _held:
    """A lock already acquired, released on exit."""

    def __init__(self, lock: threading.Lock):
        self.lock = lock

    def __enter__(self):
        return self.lock

    def __exit__(self, *exc):
        self.lock.release()


__all__ = ["DOWNLOADS", "S3Medium"]
