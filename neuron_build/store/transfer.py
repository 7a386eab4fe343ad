"""Large objects to S3: concurrent multipart uploads that stay create-only (the downloads:
:mod:`neuron_build.store.ranged`).

Why not boto3's transfer manager (s3transfer): it refuses ``IfNoneMatch`` in ``ExtraArgs`` (not in
``ALLOWED_UPLOAD_ARGS``) and would not pass it to ``CompleteMultipartUpload`` (``COMPLETE_MULTIPART_ARGS``),
so a blob could no longer be written create-only; and its downloads hash nothing. The same scheme is done
here on s3fs's aiobotocore client, so every request keeps the bounds of :mod:`neuron_build.store.wire`
(timeouts, attempts, the upload watchdog):

- an upload of ``multipart_threshold`` bytes or more is a multipart upload of ``multipart_chunksize`` parts
  (more when the object would need over 10,000 parts), ``max_concurrency`` parts in flight, each read from
  the file when its turn comes (memory: ``max_concurrency`` parts); the completion carries
  ``If-None-Match: *`` for a create-only write. A lost race (412 ``PreconditionFailed``, 409
  ``ConditionalRequestConflict``) or a ``NoSuchUpload`` from a competing completion is
  :class:`LostRace`: the caller checks whether the object is there now.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from neuron_build.errors import NeuronBuildError
from neuron_build.remote_options import MAX_PARTS

#: Error codes of a create-only write that lost to another writer (or of a competing completion).
LOST_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409", "NoSuchUpload")

_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


#: id(aiobotocore client) -> the boto3 client of the same store (the ranged reader of :mod:`neuron_build.store.ranged` uses it)
SYNC_CLIENT: dict[int, Any] = {}
_POOLS: dict[int, Any] = {}


def thread_pool(n: int) -> Any:
    """The process-wide thread pool of ``n`` threads that runs blocking S3 range reads (one per size,
    made on first use and kept for the life of the process)."""
    from concurrent.futures import ThreadPoolExecutor

    with _KEY_LOCKS_GUARD:
        if n not in _POOLS:
            _POOLS[n] = ThreadPoolExecutor(n, thread_name_prefix="s3-range")
        return _POOLS[n]


class LostRace(NeuronBuildError):
    """A create-only upload found the object written by another writer (or its upload completed by one)."""


def key_lock(name: str) -> threading.Lock:
    """The process-wide lock of one object (``bucket/key``): two threads of a process never upload the same
    blob at once (the second waits, then finds it there)."""
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault(name, threading.Lock())


def error_code(e: BaseException) -> str:
    """The S3 error code of a botocore ``ClientError`` (or its cause), or ``""``."""
    while e is not None:
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            return str((resp.get("Error") or {}).get("Code") or resp.get("ResponseMetadata", {}).get(
                "HTTPStatusCode") or "")
        e = e.__cause__ or e.__context__
    return ""


def part_size(size: int, chunk: int) -> int:
    """The part size of an upload of ``size`` bytes: ``chunk``, or more when it would need over
    :data:`~neuron_build.remote_options.MAX_PARTS` (S3's 10,000) parts."""
    return max(chunk, -(-size // MAX_PARTS))


async def s3_client(fs: Any) -> Any:
    """The aiobotocore client of an s3fs filesystem ``fs`` (its session opened first); records the boto3
    client of the same store in :data:`SYNC_CLIENT` when ``fs`` carries one."""
    await fs.set_session()
    sync = getattr(fs, "_nb_sync_client", None)
    if sync is not None:
        SYNC_CLIENT[id(fs.s3)] = sync
    return fs.s3


async def upload(fs: Any, bucket: str, key: str, src: Path, settings: Any, create_only: bool) -> None:
    """Upload the file ``src`` to ``bucket/key``: one ``PutObject`` below ``settings.multipart_threshold``
    bytes, else a multipart upload of ``settings.multipart_chunksize`` parts, ``settings.max_concurrency`` at
    once, aborted on any failure (``settings``: a :class:`~neuron_build.store.wire.WireSettings`).

    Raises:
        LostRace: create-only, and another writer's object is (or was being) written there.
        botocore/aiohttp errors: a failed request (after the client's attempts).
    """
    s3 = await s3_client(fs)
    match = {"IfNoneMatch": "*"} if create_only else {}
    size = src.stat().st_size
    try:
        if size < settings.multipart_threshold:
            await s3.put_object(Bucket=bucket, Key=key, Body=src.read_bytes(), **match)
            return
        uid = (await s3.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]
        try:
            parts = await _parts(s3, (bucket, key, uid), src, size, part_size(size, settings.multipart_chunksize),
                                 settings.max_concurrency)
            await s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                               MultipartUpload={"Parts": parts}, **match)
        except BaseException:
            try:
                await s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
            except Exception:  # gone already (a competing completion), or the network: S3's lifecycle rule
                pass
            raise
    except Exception as e:
        if create_only and error_code(e) in LOST_CODES:
            raise LostRace(f"{error_code(e)}: another writer's object is there") from e
        raise


async def _parts(s3: Any, where: tuple[str, str, str], src: Path, size: int, psize: int,
                 concurrency: int) -> list[dict[str, Any]]:
    bucket, key, uid = where
    sem = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()

    def read(at: int) -> bytes:
        with open(src, "rb") as f:
            f.seek(at)
            return f.read(psize)

    async def one(n: int, at: int) -> dict[str, Any]:
        async with sem:
            body = await loop.run_in_executor(None, read, at)
            r = await s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=body)
            return {"PartNumber": n, "ETag": r["ETag"]}

    tasks = [asyncio.ensure_future(one(n, at)) for n, at in enumerate(range(0, size, psize), 1)]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


__all__ = ["LOST_CODES", "LostRace", "error_code", "key_lock", "part_size", "s3_client",
           "thread_pool", "upload"]
