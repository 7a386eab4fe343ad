"""Large objects from S3: ranged concurrent downloads, hashed as they arrive, resumable.

A download asks for the first part with a ``Range``; an object larger than that is fetched in ranges of
``multipart_chunksize`` bytes, ``max_concurrency`` requests in flight all the time: a range that comes early
waits in memory for its turn (at most ``2 * max_concurrency`` ranges are held, in flight or waiting), so
one slow range does not stop the others from starting. The ranges are handed in order to two threads,
one writing the file, one hashing (both release the GIL), so the sha256 is of the bytes written and no
second read is needed; the file's writeback starts as it grows (``sync_file_range``), so the fsync at the
end waits for little. The ranges after the first are read through the store's boto3 client in threads
(same timeouts and attempts): one event loop reading every socket was measured 4x slower than boto3's
``download_file`` behind a per-connection bandwidth cap.

Measured (``benchmarks/wire_s3.py``, 1 GiB, SeaweedFS behind a 25 MB/s-per-connection proxy, a shared 2-core
VM; ``benchmarks/results/wire_s3_1g.json``): the earlier scheme (a window of ``max_concurrency`` ranges taken
strictly in order, hash and write in one thread through the page cache) took 1.26x boto3 ``download_file``,
CPU-bound (3.7 s of CPU); this one 0.97x (4.55 s against 4.69 s; the cap allows 4.29 s) with 1.9 s of CPU
against boto3's 1.8-2.3 s, and 0.6x on a heavily loaded host.

Resuming (:func:`resumable`): a folder holds a partial file per object and a sidecar with its ETag and the
bytes done; one process at a time uses the folder (a lock in it: a second process downloads without
resuming rather than share the partial files).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ctypes
import errno
import hashlib
import json
import mmap
import os
import shutil
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from neuron_build.remote_options import MAX_CONCURRENCY
from neuron_build.store.transfer import SYNC_CLIENT, error_code, s3_client, thread_pool

#: bytes of one read of a range's body (s3transfer's ``io_chunksize``)
PIECE = 256 << 10
#: the alignment of an ``O_DIRECT`` write (offset, length, buffer): a page, what every Linux file system takes
ALIGN = 4096
#: bytes written between two starts of the file's writeback (``sync_file_range``)
WRITEBACK = 32 << 20
#: a resumable download saves its progress (fdatasync, then the sidecar) after this many bytes or seconds
CHECKPOINT_BYTES, CHECKPOINT_S = 64 << 20, 0.5

#: the folder a download keeps its partial files in, to resume from (None: no resuming); see :func:`resumable`
RESUME_DIR: contextvars.ContextVar[Path | None] = contextvars.ContextVar("resume_dir", default=None)


@contextlib.contextmanager
def resumable(folder: Path) -> Iterator[Path | None]:
    """Downloads of large objects made by this thread inside the block keep their progress in ``folder``: a
    partial file per object (the bytes received so far, in order) and a sidecar ``<name>.parts.json``
    (the object's ETag and size, and the bytes done), so a download killed midway resumes from there. A
    finished download moves its partial file to its destination; one that fails keeps it.

    One process at a time: the block holds the lock ``folder/.lock`` (``flock``; the lock of a folder its
    owner removed meanwhile does not count). When another process holds it (two pulls into one
    destination), the downloads of this block do not resume (each goes to its own temporary file) and it
    yields None; else it yields ``folder``, and removes it on the way out when no partial file is left in it.
    """
    folder = Path(folder)
    fd = _own(folder)
    token = RESUME_DIR.set(folder if fd is not None else None)
    try:
        yield folder if fd is not None else None
    finally:
        RESUME_DIR.reset(token)
        if fd is not None:
            try:
                if {p.name for p in folder.iterdir()} <= {".lock"}:
                    shutil.rmtree(folder, ignore_errors=True)  # (still ours: removed under the lock)
            except OSError:
                pass
            os.close(fd)


def _own(folder: Path) -> int | None:
    """The descriptor holding ``folder/.lock`` (created), or None when another process holds it."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(lock).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:  # held (EWOULDBLOCK), or removed by its owner since we opened it
        pass
    os.close(fd)
    return None


class _Partial:
    """The partial file of a resumable download and its sidecar."""

    def __init__(self, folder: Path, key: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / key.rsplit("/", 1)[-1]
        self.side = folder / (self.path.name + ".parts.json")

    def done(self) -> tuple[int, str | None]:
        """(bytes done, ETag) of an earlier download, or (0, None)."""
        try:
            doc = json.loads(self.side.read_text())
            done = int(doc["done"])
            if self.path.stat().st_size >= done:
                return done, str(doc["etag"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return 0, None

    def save(self, done: int, etag: str, size: int) -> None:
        tmp = self.side.with_name(self.side.name + ".tmp")
        tmp.write_text(json.dumps({"etag": etag, "size": size, "done": done}))
        os.replace(tmp, self.side)


class _Ranges:
    """Ranged GETs of one object; ``meta`` holds its size and ETag once the first answer came."""

    def __init__(self, s3: Any, bucket: str, key: str, chunk: int):
        self.s3, self.bucket, self.key, self.chunk = s3, bucket, key, chunk
        self.meta: dict[str, Any] = {}
        #: the store's boto3 client, when known: ranges after the first are read through it in threads
        self.sync = SYNC_CLIENT.get(id(s3))
        #: set once the first answer's headers (size, ETag) came: the other ranges start then
        self.known = asyncio.Event()
        #: requests per range (botocore retries a request, not a body cut off midway: that is retried here)
        self.attempts = int((s3.meta.config.retries or {}).get("total_max_attempts") or 4)

    async def get(self, at: int) -> list[bytes]:
        """The bytes of the range at ``at``: a body cut off or stalled midway is asked for again (up to
        :attr:`attempts` times; a request that fails is botocore's to retry, so a dark network still ends
        within one call's bound and one read timeout)."""
        if self.sync is not None and self.meta:  # boto3 in threads: the sockets read in parallel
            return await asyncio.get_running_loop().run_in_executor(thread_pool(MAX_CONCURRENCY), self._get_sync, at)
        for attempt in range(1, self.attempts + 1):
            resp = await self._request(at)
            body = resp["Body"]
            try:
                return [await body.read()]
            except Exception as e:
                if attempt == self.attempts or not _cut_off(e):
                    raise
            finally:
                body.close()
        raise AssertionError("unreachable")

    def _get_sync(self, at: int) -> list[bytes]:
        for attempt in range(1, self.attempts + 1):
            resp = self.sync.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={at}-{at + self.chunk - 1}")
            try:  # in pieces, as s3transfer reads: small buffers the allocator reuses (no fresh pages per range)
                body, pieces = resp["Body"], []
                while piece := body.read(PIECE):
                    pieces.append(piece)
                return pieces
            except Exception as e:
                if attempt == self.attempts or not _cut_off(e):
                    raise
            finally:
                resp["Body"].close()
        raise AssertionError("unreachable")

    async def _request(self, at: int) -> dict[str, Any]:
        try:
            resp = await self.s3.get_object(Bucket=self.bucket, Key=self.key, Range=f"bytes={at}-{at + self.chunk - 1}")
        except Exception as e:
            if error_code(e) in ("InvalidRange", "416") and not self.meta:  # past the end (an empty object)
                resp = await self.s3.get_object(Bucket=self.bucket, Key=self.key)
                self.meta.update(size=0, etag=resp.get("ETag"), empty=True)
                self.known.set()
                return resp
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(2, f"no object {self.key}", self.key) from None
            raise
        if not self.meta:
            self.meta.update(size=_total(resp), etag=resp.get("ETag"))
            self.known.set()
        return resp

    async def first(self, at: int) -> asyncio.Future:
        """The range at ``at`` in flight, once its answer's headers came (:attr:`meta` is known then)."""
        task = asyncio.ensure_future(self.get(at))
        known = asyncio.ensure_future(self.known.wait())
        await asyncio.wait({task, known}, return_when=asyncio.FIRST_COMPLETED)
        known.cancel()
        if task.done() and task.exception() is not None:
            raise task.exception()
        return task

    async def stream(self, first: asyncio.Future, start: int, sink: _Sink, concurrency: int) -> None:
        """The range ``first`` (in flight), then the ranges from ``start`` to the end: ``concurrency``
        requests in flight whenever at most ``2 * concurrency`` ranges are held; each range handed to
        ``sink`` in order."""
        todo = iter(range(start, self.meta["size"], self.chunk))
        window: deque[asyncio.Future] = deque([first])  # in offset order: in flight, or come and waiting
        stopped = False

        def fill(_: Any = None) -> None:
            running = sum(1 for t in window if not t.done())
            while not stopped and running < concurrency and len(window) < 2 * concurrency:
                at = next(todo, None)
                if at is None:
                    return
                task = asyncio.ensure_future(self.get(at))
                task.add_done_callback(fill)
                window.append(task)
                running += 1

        try:
            fill()
            while window:
                data = await window[0]
                window.popleft()
                fill()
                await sink.take(data)
            await sink.drain()
        except BaseException:
            stopped = True
            for t in window:
                t.cancel()
            await asyncio.gather(*window, return_exceptions=True)
            raise


class _Writer:
    """Writes the ranges of one download in order from ``at``: through ``O_DIRECT`` (a second descriptor of
    ``path`` and an aligned buffer of one range) where the system has it and the offsets are aligned, the
    unaligned tail and everything else through ``fd``, whose writeback is then started every
    :data:`WRITEBACK` bytes. ``O_DIRECT`` skips the page cache: measured here (2-core VM, loaded), 1 GiB
    written and fsynced in 0.75 s and 0.15 s of CPU, against 4-9 s and 0.8-2 s through the page cache (what
    boto3's ``download_file`` pays), which left the hashing no CPU."""

    def __init__(self, fd: int, path: Path, at: int, chunk: int):
        self.fd, self.at, self.flushed = fd, at, at
        self.direct: int | None = None
        self.buf: Any = None
        if hasattr(os, "O_DIRECT") and at % ALIGN == 0 and chunk % ALIGN == 0:
            try:
                self.direct = os.open(path, os.O_WRONLY | os.O_DIRECT)
                self.buf = mmap.mmap(-1, chunk)
            except OSError:  # a file system without O_DIRECT
                self.close()

    def write(self, pieces: list[bytes]) -> None:
        """Write ``pieces`` (one range) at :attr:`at`; a file system that refuses a direct write (EINVAL)
        gets this and the rest through the page cache."""
        n = sum(len(p) for p in pieces)
        if self.direct is not None and n <= len(self.buf):
            refused = False
            with memoryview(self.buf) as mv:
                o = 0
                for p in pieces:
                    mv[o:o + len(p)] = p
                    o += len(p)
                cut = n - n % ALIGN
                try:
                    _pwrite(self.direct, mv[:cut], self.at)
                except OSError as e:
                    if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    refused, cut = True, 0
                _pwrite(self.fd, mv[cut:n], self.at + cut)
            if refused:
                self.close()
        else:
            at = self.at
            for p in pieces:
                _pwrite(self.fd, p, at)
                at += len(p)
            if at - self.flushed >= WRITEBACK:
                _start_writeback(self.fd, self.flushed, at - self.flushed)
                self.flushed = at
        self.at += n

    def close(self) -> None:
        """Close the direct descriptor and drop the buffer (``fd`` is the caller's)."""
        if self.direct is not None:
            os.close(self.direct)
            self.direct = None
        if self.buf is not None:
            self.buf.close()
            self.buf = None


def _pwrite(fd: int, data: Any, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


class _Sink:
    """Where the ranges of one download go, in order: written by ``out`` in one thread and hashed into ``h`` in
    another, one range in hand at a time; with ``part``, the progress saved every :data:`CHECKPOINT_BYTES`
    bytes or :data:`CHECKPOINT_S` seconds (fdatasync, then the sidecar)."""

    def __init__(self, out: _Writer, h: Any, part: _Partial | None, meta: dict[str, Any]):
        self.out, self.h, self.part, self.meta = out, h, part, meta
        self.pools = (ThreadPoolExecutor(1, thread_name_prefix="s3-write"),
                      ThreadPoolExecutor(1, thread_name_prefix="s3-hash"))
        self.busy: asyncio.Future | None = None
        self.saved, self.saved_at = out.at, time.monotonic()

    async def take(self, data: list[bytes]) -> None:
        """Hand ``data`` (the next range, in pieces) on, once the range before it is written and hashed."""
        await self.drain()
        loop = asyncio.get_running_loop()
        self.busy = asyncio.gather(loop.run_in_executor(self.pools[0], self._write, data),
                                   loop.run_in_executor(self.pools[1], self._hash, data))

    def _hash(self, data: list[bytes]) -> None:
        for piece in data:
            self.h.update(piece)

    async def drain(self) -> None:
        """Wait for the range in hand."""
        if self.busy is not None:
            busy, self.busy = self.busy, None
            await busy

    def close(self) -> None:
        for p in self.pools:
            p.shutdown(wait=True)
        self.out.close()

    def _write(self, data: list[bytes]) -> None:
        self.out.write(data)
        at = self.out.at
        if self.part is not None and (at - self.saved >= CHECKPOINT_BYTES
                                      or time.monotonic() - self.saved_at >= CHECKPOINT_S):
            os.fdatasync(self.out.fd)  # progress on disk first, then in the sidecar
            self.part.save(at, self.meta["etag"], self.meta["size"])
            self.saved, self.saved_at = at, time.monotonic()


async def download(fs: Any, where: tuple[str, str], dest: Path, chunk: int, concurrency: int,
                   resume: Path | None = None) -> str:
    """Download the object ``where`` (bucket, key) to ``dest`` in ranges of ``chunk`` bytes, ``concurrency``
    requests in flight, written and hashed in order as they arrive; fsynced. Returns the sha256 of the
    bytes. With ``resume`` (a folder, see :func:`resumable`) the bytes go to a partial file there first, and
    an earlier partial download of the same object (same ETag) is continued: its bytes are hashed from the
    disk, not fetched again.

    Raises:
        FileNotFoundError: no such object.
    """
    rg = _Ranges(await s3_client(fs), where[0], where[1], chunk)
    loop = asyncio.get_running_loop()
    part = _Partial(resume, where[1]) if resume is not None else None
    start, etag = part.done() if part is not None else (0, None)
    first = await rg.first(start)
    if start and (rg.meta["etag"] != etag or rg.meta.get("empty")):  # another object since: start over
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        rg.meta.clear()
        rg.known.clear()
        start, first = 0, await rg.first(0)
    h = hashlib.sha256()
    path = part.path if part is not None else dest
    with open(path, "r+b" if start else "wb") as f:
        if start:
            await loop.run_in_executor(None, _rehash, f, start, h)
            f.truncate(start)
        sink = _Sink(_Writer(f.fileno(), path, start, chunk), h, part if rg.meta["size"] > chunk else None, rg.meta)
        try:
            await rg.stream(first, start + chunk, sink, concurrency)
        finally:
            sink.close()
        await loop.run_in_executor(None, os.fsync, f.fileno())
    if part is not None:
        os.replace(part.path, dest)
        part.side.unlink(missing_ok=True)
    return h.hexdigest()


def _total(resp: dict[str, Any]) -> int:
    """The object's size from a (ranged) GET's answer."""
    cr = resp.get("ContentRange") or ""
    if "/" in cr and cr.rsplit("/", 1)[1].isdigit():
        return int(cr.rsplit("/", 1)[1])
    return int(resp.get("ContentLength") or 0)


def _cut_off(e: BaseException) -> bool:
    """Was ``e`` a body cut off or stalled midway (a reset, a read timeout while streaming)?"""
    names = {"ClientPayloadError", "ServerDisconnectedError", "ClientOSError", "ResponseStreamingError",
             "ReadTimeoutError", "IncompleteReadError", "ContentLengthError", "TimeoutError"}
    while e is not None:
        if type(e).__name__ in names or isinstance(e, ConnectionError | TimeoutError):
            return True
        e = e.__cause__ or e.__context__
    return False


def _rehash(f: Any, upto: int, h: Any) -> None:
    f.seek(0)
    left = upto
    while left > 0 and (b := f.read(min(left, 8 << 20))):
        h.update(b)
        left -= len(b)
    f.seek(upto)


_LIBC: list[Any] = []


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing the file's dirty pages in ``[offset, offset + nbytes)`` to disk without waiting
    (Linux ``sync_file_range(..., SYNC_FILE_RANGE_WRITE)``); nothing elsewhere (the fsync at the end does it)."""
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            _LIBC.append(fn)
        except (OSError, AttributeError):
            _LIBC.append(None)
    if _LIBC[0] is not None:
        _LIBC[0](fd, offset, nbytes, 2)  # SYNC_FILE_RANGE_WRITE


__all__ = ["ALIGN", "CHECKPOINT_BYTES", "CHECKPOINT_S", "PIECE", "RESUME_DIR", "WRITEBACK", "download", "resumable"]
