"""Large objects on S3: concurrent multipart uploads that stay create-only, and ranged concurrent downloads
hashed as they arrive.

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
  :class:`LostRace`: the caller checks whether the object is there now;
- a download asks for the first part with a ``Range``; an object larger than that is fetched in ranges,
  ``max_concurrency`` at a time, written and hashed in order as they arrive (no second read; memory:
  ``max_concurrency`` parts).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections import deque
from pathlib import Path
from typing import Any

#: S3's smallest part (all but the last) and its most parts per upload.
MIN_PART, MAX_PARTS = 5 << 20, 10_000
#: Error codes of a create-only write that lost to another writer (or of a competing completion).
LOST_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409", "NoSuchUpload")

_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


class LostRace(Exception):
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
    :data:`MAX_PARTS` parts."""
    return max(chunk, -(-size // MAX_PARTS))


async def _client(fs: Any) -> Any:
    await fs.set_session()
    return fs.s3


async def upload(fs: Any, bucket: str, key: str, src: Path, settings: Any, create_only: bool) -> None:
    """Upload the file ``src`` to ``bucket/key``: one ``PutObject`` below ``settings.multipart_threshold``
    bytes, else a multipart upload of ``settings.multipart_chunksize`` parts, ``settings.max_concurrency`` at
    once, aborted on any failure (``settings``: a :class:`~neuron_build.store.wire.WireSettings`).

    Raises:
        LostRace: create-only, and another writer's object is (or was being) written there.
        botocore/aiohttp errors: a failed request (after the client's attempts).
    """
    s3 = await _client(fs)
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


def _total(resp: dict[str, Any]) -> int:
    """The object's size from a (ranged) GET's answer."""
    cr = resp.get("ContentRange") or ""
    if "/" in cr and cr.rsplit("/", 1)[1].isdigit():
        return int(cr.rsplit("/", 1)[1])
    return int(resp.get("ContentLength") or 0)


async def _body(resp: dict[str, Any]) -> bytes:
    body = resp["Body"]
    try:
        return await body.read()
    finally:
        body.close()


async def download(fs: Any, bucket: str, key: str, dest: Path, chunk: int, concurrency: int) -> str:
    """Download ``bucket/key`` to ``dest`` in ranges of ``chunk`` bytes, ``concurrency`` at a time, written
    and hashed in order as they arrive; fsynced. Returns the sha256 of the bytes.

    Raises:
        FileNotFoundError: no such object.
    """
    s3 = await _client(fs)
    loop = asyncio.get_running_loop()

    async def ranged(at: int) -> bytes:
        try:
            resp = await s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={at}-{at + chunk - 1}")
        except Exception as e:
            if at == 0 and error_code(e) in ("InvalidRange", "416"):  # an empty object has no byte 0
                resp = await s3.get_object(Bucket=bucket, Key=key)
                sizes.append(0)
                return await _body(resp)
            if error_code(e) in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(2, f"no object {key}", key) from None
            raise
        if at == 0:
            sizes.append(_total(resp))
        return await _body(resp)

    sizes: list[int] = []
    h = hashlib.sha256()
    with open(dest, "wb") as f:
        def take(data: bytes) -> None:
            h.update(data)
            f.write(data)

        first = await ranged(0)
        await loop.run_in_executor(None, take, first)
        window: deque[asyncio.Future] = deque()
        try:
            for at in range(len(first), sizes[0], chunk) if len(first) < sizes[0] else ():
                window.append(asyncio.ensure_future(ranged(at)))
                if len(window) >= concurrency:
                    await loop.run_in_executor(None, take, await window.popleft())
            while window:
                await loop.run_in_executor(None, take, await window.popleft())
        except BaseException:
            for t in window:
                t.cancel()
            await asyncio.gather(*window, return_exceptions=True)
            raise
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


__all__ = ["LOST_CODES", "MAX_PARTS", "MIN_PART", "LostRace", "download", "error_code", "key_lock", "part_size",
           "upload"]
