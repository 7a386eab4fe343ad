"""A store at a URL (``s3://bucket/prefix``, ``memory://name``, ``file:///path``, any fsspec URL): the
second implementation of :mod:`neuron_build.store.contract`, holding the shared layout of
:mod:`neuron_build.store.layout` under the URL's prefix.

S3 has no rename, so an artifact is published without one (the order every trusted remote cache uses,
``shared/neuron-toolchain.md``, "Remote stores and many hosts"): every blob is uploaded create-only
(``If-None-Match: *``; s3fs ``put_file(..., mode="create")``), then the manifest, also create-only: the
manifest is the commit point, and a reader trusts only a manifest whose blobs are present with their sizes
(and, on a deep check, their digests). A writer that dies or loses the network mid-upload leaves blobs
nothing points to (gc collects them) and never a manifest without its blobs.

Channels move by compare-and-swap on the pointer's version token: on S3 the ETag, through boto3
``put_object(IfMatch=etag)`` / ``IfNoneMatch="*"`` (s3fs has no If-Match on writes); a 412 or 409 is a lost
race. On other filesystems the token is the sha256 of the pointer's bytes and the swap is made atomic by a
lock that holds on that filesystem (a file lock for ``file://``, a process lock for ``memory://``); a
filesystem with neither conditional writes nor locks refuses the swap with a clear error rather than risk
a lost update. History entries are new objects, never appends.

The compile lock of a key is a lease object ``leases/<key>.json`` (:class:`LeaseLock`): file locks do not
cross hosts. The host-memory ledger is host-local, in a :class:`~neuron_build.store.local.LocalStore` in
this store's local cache folder (``$XDG_CACHE_HOME`` or ``~/.cache``, then
``neuron-build/remote/<sha256 of the URL>/``), which also holds the staging folders and the views that
:meth:`RemoteStore.artifact_dir` downloads (verified) for loading.

Faults on the wire are raised as :class:`~neuron_build.errors.StoreError` subclasses, one line naming the
URL and the fix, with ``writing`` telling a failed read (a read-through cache fails open) from a failed
write. Retries with backoff are botocore's (``standard`` mode, :data:`RETRIES`); s3fs's own retry loop is
turned off so the two do not multiply. Every call is bounded (timeouts, attempts, an upload watchdog):
:mod:`neuron_build.store.wire`.

s3fs and boto3 are imported only when an ``s3://`` store is opened (the ``s3`` extra).
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from neuron_build.errors import StoreDenied, StoreError, StoreFailed, StoreMissing, StoreUnreachable
from neuron_build.store import layout
from neuron_build.store.contract import Lookup
from neuron_build.store.local import LocalStore, ReadOnlyStore, check_manifest, is_key, utc_now_us
from neuron_build.store.manifest import MANIFEST, Manifest
from neuron_build.store.objects import JsonObjects
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.store.wire import WireSettings
from neuron_build.util import file_sha256, fsync_path, json_bytes, sha256_hex, temp_name, write_atomic

#: botocore's retry policy for every S3 call (s3fs and boto3 alike): ``standard`` mode retries
#: connection errors, 5xx and throttling (503 SlowDown) with exponential backoff and jitter. The defaults
#: of :class:`~neuron_build.store.wire.WireSettings` (``[build] remote_options`` sets them).
RETRIES = WireSettings().retries()
#: Seconds to wait for a TCP connection to the endpoint / for a response (or upload progress).
CONNECT_TIMEOUT_S = WireSettings.connect_timeout_s
READ_TIMEOUT_S = WireSettings.read_timeout_s
#: Seconds a compile lease lasts without renewal; the holder renews it every quarter of this.
LEASE_TTL_S = 60.0
#: Chunk size of streaming hashes, bytes.
CHUNK = 1 << 20
#: Blobs downloaded at once by :meth:`RemoteStore.get_blobs` on S3.
DOWNLOADS = 8

_MEMORY_LOCK = threading.RLock()  # memory:// lives in this process: one lock makes its writes atomic


def cache_root(url: str) -> Path:
    """The local cache folder of the store at ``url``: ``$XDG_CACHE_HOME`` (or ``~/.cache``) +
    ``neuron-build/remote/<sha256 of the URL, 16 hex chars>``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-build" / "remote" / sha256_hex(url.encode())[:16]


def is_url(location: str | Path) -> bool:
    """Does ``location`` name a remote store (a URL with a scheme: ``s3://``, ``memory://``, ...)?
    ``file://`` counts as a URL too; a plain path does not."""
    return isinstance(location, str) and "://" in location


# ------------------------------------------------------------------------------------------------------
# faults on the wire

def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def wire_error(exc: BaseException, url: str, what: str, writing: bool, endpoint: str | None = None,
               attempts: int = RETRIES["total_max_attempts"]) -> StoreError | None:
    """The :class:`~neuron_build.errors.StoreError` for an exception raised by s3fs, boto3 or fsspec, or
    None when it is no fault of the wire (e.g. an absent object, a lost compare-and-swap).

    Messages read ``<url>: <what went wrong> (<operation>); <the fix>``.

    Args:
        exc: what the client library raised.
        url: the store's URL, named in the message.
        what: the operation, e.g. ``"reading ac/ab/ab...json"``.
        writing: whether the operation writes (see :class:`~neuron_build.errors.StoreError`).
        endpoint: the endpoint the client talks to, when known (``AWS_ENDPOINT_URL``).
        attempts: how many attempts the client library made per request (``total_max_attempts``).
    """
    if isinstance(exc, StoreError):
        return exc
    at = f" {endpoint}" if endpoint else ""
    chain = list(_chain(exc))
    code, status = "", None
    for e in chain:  # s3fs turns a ClientError into an OSError: the code is on its cause
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = code or str((resp.get("Error") or {}).get("Code") or "")
            status = status or (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    names = {type(e).__name__ for e in chain}
    if names & {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}:
        return StoreDenied(f"{url}: no credentials found ({what}); set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                           f"AWS_SECRET_ACCESS_KEY, or give them in [build] remote_options", url, writing)
    if any(_is_missing_bucket(e) for e in chain):
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        return StoreMissing(f"{url}: bucket {bucket!r} does not exist{' at' + at if at else ''} ({what}); "
                            f"create it (`aws s3 mb s3://{bucket}`) or fix the store URL", url, writing)
    if (code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                 "AllAccessDisabled", "403") or status == 403 or any(isinstance(e, PermissionError) for e in chain)):
        fix = ("use credentials that may write to it, or open the store read-only" if writing
               else "check AWS_PROFILE / AWS_ACCESS_KEY_ID and the bucket policy")
        return StoreDenied(f"{url}: access denied{' (' + code + ')' if code and code != '403' else ''} ({what}); "
                           f"{fix}", url, writing)
    if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "ServiceUnavailable",
                "InternalError", "500", "502", "503", "504") or (isinstance(status, int) and status >= 500):
        kind = "throttled (503 SlowDown)" if code == "SlowDown" else f"server error ({status or ''} {code})".replace(
            "( ", "(")
        return StoreFailed(f"{url}: {kind} after {attempts} attempts with backoff ({what}); retry later "
                           f"(nothing half-published is left)", url, writing)
    unreachable = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError",
                   "ClientConnectorError", "ServerDisconnectedError", "ClientOSError", "ProxyConnectionError",
                   "ServerTimeoutError"}
    hit = [e for e in chain if type(e).__name__ in unreachable or isinstance(e, ConnectionError | TimeoutError)]
    if hit:
        return StoreUnreachable(f"{url}: cannot reach the endpoint{at} ({what}: {type(hit[0]).__name__}); check the "
                                f"network and AWS_ENDPOINT_URL (or endpoint_url in [build] remote_options)",
                                url, writing)
    return None


def _is_missing_bucket(e: BaseException) -> bool:
    resp = getattr(e, "response", None)
    code = ((resp.get("Error") or {}).get("Code") if isinstance(resp, dict) else None)
    return code == "NoSuchBucket" or "specified bucket does not exist" in str(e).lower()


# ------------------------------------------------------------------------------------------------------
# backends: how one filesystem writes a whole object, conditionally

class _Backend:
    """A filesystem behind a store: whole-object reads and writes, create-only and compare-and-swap.
    Tokens of the generic backend are the sha256 of the object's bytes."""

    protocol = "generic"
    #: whether :meth:`swap` is atomic on this filesystem
    can_swap = False

    def __init__(self, fs: Any, root: str):
        self.fs, self.root = fs, root.rstrip("/")

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def read(self, rel: str) -> tuple[bytes, str] | None:
        try:
            data = self.fs.cat_file(self.full(rel))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return data, sha256_hex(data)

    def write(self, rel: str, data: bytes, create_only: bool) -> bool:
        path = self.full(rel)
        try:
            self.fs.pipe_file(path, data, mode="create" if create_only else "overwrite")
        except FileExistsError:
            return False
        return True

    def swap(self, rel: str, data: bytes, expected: str | None) -> bool:
        raise StoreError(f"{self.full(rel)}: the {self.protocol} filesystem has no conditional writes, so channels "
                         f"and leases cannot move safely; use an s3:// or file:// store", self.protocol, True)

    def delete(self, rel: str, token: str | None = None) -> bool:
        path = self.full(rel)
        if token is not None:
            cur = self.read(rel)
            if cur is None or cur[1] != token:
                return False
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True

    def upload(self, src: Path, rel: str, create_only: bool) -> bool:
        try:
            self.fs.put_file(str(src), self.full(rel), mode="create" if create_only else "overwrite")
        except FileExistsError:
            return False
        return True

    def download(self, pairs: list[tuple[str, Path]]) -> list[str]:
        """Copy each object ``rel`` to the local file ``dest`` (fsynced); the sha256 of each, in order."""
        out = []
        for rel, dest in pairs:
            self.fs.get_file(self.full(rel), str(dest))
            fsync_path(Path(dest))
            out.append(file_sha256(dest))
        return out

    def modified(self, rel: str) -> float | None:
        """When the object at ``rel`` was last written (POSIX seconds), or None when absent or unknown."""
        try:
            return self.fs.modified(self.full(rel)).timestamp()
        except (FileNotFoundError, NotADirectoryError, NotImplementedError):
            return None

    def size(self, rel: str) -> int | None:
        try:
            info = self.fs.info(self.full(rel))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return None if info.get("type") == "directory" else int(info["size"])

    def find(self, prefix: str) -> list[str]:
        base = self.full(prefix)
        try:
            found = self.fs.find(base)
        except FileNotFoundError as e:
            if any(_is_missing_bucket(c) for c in _chain(e)):
                raise
            return []
        strip = self.fs._strip_protocol(self.root).rstrip("/") + "/"
        out = []
        for p in found:
            p = self.fs._strip_protocol(p)
            if p.startswith(strip):
                rel = p[len(strip):]
                if not rel.rsplit("/", 1)[-1].startswith("."):
                    out.append(rel)
        return sorted(out)

    def copy(self, src_rel: str, dest_rel: str) -> None:
        self.fs.copy(self.full(src_rel), self.full(dest_rel))

    def invalidate(self) -> None:
        try:
            self.fs.invalidate_cache()
        except Exception:
            pass


class _Memory(_Backend):
    """``memory://``: one process's dict; a process-wide lock makes create-only and swaps atomic."""

    protocol = "memory"
    can_swap = True

    def write(self, rel, data, create_only):
        with _MEMORY_LOCK:
            if create_only and self.fs.exists(self.full(rel)):
                return False
            self.fs.pipe_file(self.full(rel), data)
            return True

    def swap(self, rel, data, expected):
        with _MEMORY_LOCK:
            cur = self.read(rel)
            if (cur[1] if cur else None) != expected:
                return False
            self.fs.pipe_file(self.full(rel), data)
            return True

    def delete(self, rel, token=None):
        with _MEMORY_LOCK:
            return super().delete(rel, token)

    def upload(self, src, rel, create_only):
        return self.write(rel, Path(src).read_bytes(), create_only)


class _File(_Backend):
    """``file://``: temporary name, fsync, rename (create-only by hard link); swaps under a file lock in the
    folder's local-only ``locks/`` area, so they hold across processes and across hosts of a shared mount
    whose locks work."""

    protocol = "file"
    can_swap = True

    def local(self, rel: str) -> Path:
        return Path(self.full(rel))

    def write(self, rel, data, create_only):
        return write_atomic(self.local(rel), data, create_only=create_only)

    def swap(self, rel, data, expected):
        from filelock import FileLock
        lock = Path(self.root) / "locks" / "swap" / (rel.replace("/", "__") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(lock), timeout=30):
            cur = self.read(rel)
            if (cur[1] if cur else None) != expected:
                return False
            write_atomic(self.local(rel), data)
            return True

    def copy(self, src_rel, dest_rel):
        self.local(dest_rel).parent.mkdir(parents=True, exist_ok=True)
        super().copy(src_rel, dest_rel)

    def upload(self, src, rel, create_only):
        dest = self.local(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        try:
            shutil.copyfile(src, tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if not create_only:
                os.replace(tmp, dest)
                return True
            try:
                os.link(tmp, dest)
            except FileExistsError:
                return False
            return True
        finally:
            tmp.unlink(missing_ok=True)


class _S3(_Backend):
    """``s3://``: s3fs for blobs, listings and reads; boto3 for the small objects whose ETag matters
    (``IfNoneMatch="*"`` to create, ``IfMatch=etag`` to swap, ``DeleteObject(IfMatch=...)``)."""

    protocol = "s3"
    can_swap = True

    def __init__(self, fs: Any, root: str, client: Any):
        super().__init__(fs, root)
        self.client = client
        self.bucket, _, self.prefix = root.partition("/")
        self.prefix = self.prefix.strip("/")

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    @staticmethod
    def _code(e: Exception) -> str:
        return str((getattr(e, "response", None) or {}).get("Error", {}).get("Code", ""))

    def read(self, rel):
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404"):
                return None
            raise
        return r["Body"].read(), r["ETag"]

    def _put(self, rel: str, data: bytes, **cond: str) -> bool:
        try:
            self.client.put_object(Bucket=self.bucket, Key=self.key(rel), Body=data, **cond)
        except Exception as e:
            if self._code(e) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return False
            if cond.get("IfMatch") and self._code(e) in ("NoSuchKey", "404"):
                return False  # the pointer was deleted meanwhile: the swap lost
            raise
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return True

    def write(self, rel, data, create_only):
        return self._put(rel, data, **({"IfNoneMatch": "*"} if create_only else {}))

    def swap(self, rel, data, expected):
        return self._put(rel, data, **({"IfMatch": expected} if expected is not None else {"IfNoneMatch": "*"}))

    def delete(self, rel, token=None):
        if self.read(rel) is None:
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

    def upload(self, src, rel, create_only):
        try:
            self.fs.put_file(str(src), self.full(rel), mode="create" if create_only else "overwrite")
        except FileExistsError:
            return False
        finally:
            self.fs.invalidate_cache(self.full(rel))
        return True

    def download(self, pairs):
        """All objects concurrently (at most :data:`DOWNLOADS` at once) on s3fs's event loop, each one
        streamed to its file and hashed as its chunks arrive (no second read), then fsynced."""
        if not pairs:
            return []
        from fsspec.asyn import sync
        return sync(self.fs.loop, self._download_all, pairs)

    async def _download_all(self, pairs):
        import asyncio
        sem = asyncio.Semaphore(DOWNLOADS)

        async def one(rel: str, dest: Path) -> str:
            async with sem:
                return await self._download_one(rel, dest)

        return list(await asyncio.gather(*(one(r, d) for r, d in pairs)))

    async def _download_one(self, rel: str, dest: Path) -> str:
        resp = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key(rel))
        body = resp["Body"]
        h = hashlib.sha256()
        try:
            with open(dest, "wb") as f:
                while chunk := await body.read(4 * CHUNK):
                    h.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        finally:
            body.close()
        return h.hexdigest()

    def _head(self, rel) -> dict | None:
        """``HeadObject`` of ``rel``, or None when there is no such object."""
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise

    def size(self, rel):
        head = self._head(rel)
        return None if head is None else int(head["ContentLength"])

    def modified(self, rel):
        head = self._head(rel)
        return None if head is None else head["LastModified"].timestamp()


#: (options, AWS variables) -> (s3fs filesystem, boto3 client, endpoint): making a client costs ~1 s of CPU
#: (botocore loads its service models), so a process makes one per configuration. Clients are thread-safe.
_CLIENTS: dict[str, tuple[Any, Any, str | None]] = {}
_CLIENTS_LOCK = threading.Lock()
_LOADER: Any = None
_AWS_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE")


def clear_client_cache() -> None:
    """Forget the cached S3 clients (tests that stop an endpoint; a process that rotated credentials)."""
    with _CLIENTS_LOCK:
        _CLIENTS.clear()


def _s3_clients(url: str, options: dict[str, Any]) -> tuple[Any, Any, str | None]:
    """(s3fs filesystem, boto3 client, endpoint) for ``options`` (s3fs storage options: ``key``,
    ``secret``, ``token``, ``profile``, ``endpoint_url``, ``client_kwargs``, ``config_kwargs``, ...), both with
    :data:`RETRIES` and the timeouts. Credentials and the endpoint come from the standard AWS variables
    when the options do not give them, as s3fs and boto3 read them. Cached per configuration."""
    ident = json.dumps([options, [os.environ.get(v) for v in _AWS_VARS]], sort_keys=True, default=str)
    with _CLIENTS_LOCK:
        if ident in _CLIENTS:
            return _CLIENTS[ident]
    try:
        import boto3
        import s3fs
        from botocore.config import Config
    except ImportError as e:
        from neuron_build.errors import UserError
        raise UserError(f"{url}: an s3:// store needs s3fs and boto3 ({e.name} is missing); install them with "
                        f"`pip install 'neuron-build[s3]'`")
    global _LOADER
    wire, opts = WireSettings.from_options(copy.deepcopy(dict(options)))
    cfg = {**(opts.pop("config_kwargs", None) or {}), **wire.aiobotocore_config()}  # every call bounded
    theirs = (options.get("config_kwargs") or {}).get("retries")  # a retry mode of the user's own is kept
    if isinstance(theirs, dict) and theirs.get("mode"):
        cfg["retries"] = {**cfg["retries"], "mode": theirs["mode"]}
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    endpoint = opts.pop("endpoint_url", None) or client_kwargs.pop("endpoint_url", None)
    from aiobotocore.session import AioSession
    from botocore.loaders import create_loader

    if _LOADER is None:
        _LOADER = create_loader()  # botocore's service models, parsed once per process (its own cache)
    aio = AioSession(profile=opts.pop("profile", None))
    aio.register_component("data_loader", _LOADER)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, client_kwargs=client_kwargs or None, config_kwargs=cfg,
                           skip_instance_cache=True, use_listings_cache=False, session=aio, **opts)
    fs.retries = 1  # botocore retries (RETRIES); s3fs's own loop would multiply them
    session = boto3.session.Session(profile_name=aio.profile, aws_access_key_id=opts.get("key"),
                                    aws_secret_access_key=opts.get("secret"), aws_session_token=opts.get("token"))
    session._session.register_component("data_loader", _LOADER)
    client = session.client("s3", endpoint_url=endpoint, region_name=client_kwargs.get("region_name"),
                            config=Config(**{k: v for k, v in cfg.items() if k != "http_session_cls"}))
    made = (fs, client, endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    with _CLIENTS_LOCK:
        return _CLIENTS.setdefault(ident, made)


# ------------------------------------------------------------------------------------------------------

class RemoteStore(JsonObjects):
    """A store at a URL. Implements :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        url: ``s3://bucket/prefix``, ``memory://name``, ``file:///path`` or any fsspec URL.
        options: fsspec storage options (``[build] remote_options``), e.g. ``{"profile": "ci"}`` or
            ``{"endpoint_url": "http://minio:9000"}`` for S3.
        read_only: never write: every writing method raises
            :class:`~neuron_build.store.local.ReadOnlyStore`; :meth:`repair` only reports.
        cache_dir: the local cache folder (default :func:`cache_root` of the URL).

    Attributes:
        location: the URL (for messages).
        cache: the :class:`~neuron_build.store.local.LocalStore` in the cache folder (staging, views, the
            host-memory ledger).

    Raises:
        UserError: an ``s3://`` URL without s3fs and boto3 installed, or a URL fsspec does not know.
    """

    def __init__(self, url: str, options: dict[str, Any] | None = None, read_only: bool = False,
                 cache_dir: str | Path | None = None):
        self.url = url.rstrip("/")
        self.location = self.url
        self.options = copy.deepcopy(dict(options or {}))  # botocore rewrites a retries dict in place
        self.read_only = read_only
        self.cache = LocalStore(Path(cache_dir) if cache_dir else cache_root(self.url))
        proto, _, rest = self.url.partition("://")
        self.endpoint: str | None = None
        #: timeouts and retries of every call (:mod:`neuron_build.store.wire`); ``fs_options``: the rest
        self.wire, fs_options = WireSettings.from_options(self.options)
        #: attempts the client library makes per request (botocore's total_max_attempts), for messages
        self.attempts = self.wire.attempts
        if proto in ("s3", "s3a"):
            fs, client, self.endpoint = _s3_clients(self.url, self.options)
            self.io: _Backend = _S3(fs, rest, client)
        else:
            import fsspec
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **fs_options)
            except (ValueError, ImportError) as e:
                from neuron_build.errors import UserError
                raise UserError(f"{self.url}: not a store URL fsspec can open ({e}); use s3://bucket/prefix, "
                                f"file:///path or another fsspec URL")
            protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
            if "memory" in protos:
                self.io = _Memory(fs, root)
            elif "file" in protos or "local" in protos:
                self.io = _File(fs, root)
            else:
                self.io = _Backend(fs, root)
                self.io.protocol = protos[0]

    # -- the wire ---------------------------------------------------------------------------------
    @contextmanager
    def _wire(self, what: str, writing: bool = False) -> Iterator[None]:
        """Turn a client library's exception into a :class:`~neuron_build.errors.StoreError`."""
        if writing:
            self._writable()
        try:
            yield
        except ReadOnlyStore:
            raise
        except Exception as e:
            err = wire_error(e, self.url, what, writing, self.endpoint, self.attempts)
            if err is not None:
                raise err from None
            if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "urllib3", "s3fs"):
                raise StoreFailed(f"{self.url}: {type(e).__name__} ({what}: {e}); retry, or run with --debug "
                                  f"for details", self.url, writing) from e
            raise

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStore(errno.EROFS, f"store {self.url} is opened read-only")

    # -- whole objects at layout paths (ObjectIO) ---------------------------------------------------
    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        with self._wire(f"writing {path}", writing=True):
            return self.io.write(path, data, create_only)

    def get_object(self, path: str) -> bytes | None:
        with self._wire(f"reading {path}"):
            got = self.io.read(path)
        return None if got is None else got[0]

    def list_objects(self, prefix: str) -> list[str]:
        with self._wire(f"listing {prefix}/"):
            return self.io.find(prefix)

    def delete_object(self, path: str) -> bool:
        with self._wire(f"deleting {path}", writing=True):
            return self.io.delete(path)

    def object_age(self, path: str) -> float | None:
        """Seconds since the object at ``path`` was last written (S3: ``LastModified``), or None when it
        is absent or the filesystem does not say."""
        with self._wire(f"reading the age of {path}"):
            when = self.io.modified(path)
        return None if when is None else max(0.0, time.time() - when)

    def object_ref(self, path: str) -> tuple[bytes | None, str | None]:
        """The bytes at ``path`` with their version token (S3: the ETag; else their sha256), or (None, None)."""
        with self._wire(f"reading {path}"):
            got = self.io.read(path)
        return (None, None) if got is None else got

    def swap_object(self, path: str, data: bytes, expected: str | None) -> bool:
        """Compare-and-swap of a whole object: write ``data`` only when the token is still ``expected``
        (None: only when absent). False on a lost race.

        Raises:
            StoreError: the filesystem has no conditional writes, or a wire fault.
        """
        with self._wire(f"swapping {path}", writing=True):
            return self.io.swap(path, data, expected)

    def delete_object_if(self, path: str, token: str) -> bool:
        """Delete the object at ``path`` only while its token is ``token``; False otherwise."""
        with self._wire(f"deleting {path}", writing=True):
            return self.io.delete(path, token)

    # -- blobs ------------------------------------------------------------------------------------
    def blob_size(self, sha256: str) -> int | None:
        with self._wire(f"reading {layout.blob_path(sha256)}"):
            return self.io.size(layout.blob_path(sha256))

    def _blob_hash(self, sha256: str) -> str | None:
        """sha256 of the stored bytes of blob ``sha256`` (streamed, nothing written), None when absent."""
        h = hashlib.sha256()
        with self._wire(f"reading {layout.blob_path(sha256)}"):
            try:
                with self.io.fs.open(self.io.full(layout.blob_path(sha256)), "rb", block_size=8 * CHUNK) as f:
                    while b := f.read(8 * CHUNK):
                        h.update(b)
            except FileNotFoundError:
                return None
        return h.hexdigest()

    def blob_damage(self, sha256: str, size: int, deep: bool = False) -> str | None:
        """Why blob ``sha256`` cannot serve a file of ``size`` bytes (missing, another size, or with
        ``deep`` another digest, which downloads it), or None when it can. Reads only."""
        have = self.blob_size(sha256)
        if have is None:
            return f"blob {sha256[:16]}... is missing"
        if have != size:
            return f"blob {sha256[:16]}... is {have} bytes, the manifest says {size}"
        if deep:
            digest = self._blob_hash(sha256)
            if digest is None:
                return f"blob {sha256[:16]}... is missing"
            if digest != sha256:
                return f"blob {sha256[:16]}... hashes to {digest[:16]}... (rot or tampering)"
        return None

    def put_blob(self, sha256: str, src: Path) -> bool:
        """Upload ``src`` as blob ``sha256`` create-only. An existing blob of the right size whose bytes
        hash to its name is kept (this downloads it once); one of another size or digest is copied to
        ``quarantine/`` and replaced."""
        self._writable()
        src = Path(src)
        if file_sha256(src) != sha256:
            raise ValueError(f"{src} does not hash to {sha256[:16]}...; not stored as that blob")
        rel = layout.blob_path(sha256)
        with self._wire(f"uploading {rel}", writing=True):
            if self.io.upload(src, rel, create_only=True):
                return True
        why = self.blob_damage(sha256, src.stat().st_size, deep=True)
        if why is None:
            return False
        self._quarantine_copy(rel, sha256, f"{why}; replaced by a new copy")
        with self._wire(f"uploading {rel}", writing=True):
            self.io.upload(src, rel, create_only=False)
        return True

    def get_blob(self, sha256: str, dest: Path) -> None:
        self.get_blobs([(sha256, Path(dest))])

    def get_blobs(self, pairs: list[tuple[str, Path]]) -> None:
        """:meth:`get_blob` of many blobs, fetched concurrently (S3: one s3fs ``get`` of the list).

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
                with self._wire(f"downloading {len(pairs)} blob(s)"):
                    digests = self.io.download([(layout.blob_path(sha), tmp) for sha, _, tmp in tmps])
            except FileNotFoundError:
                missing = [sha for sha, _, _ in tmps if self.blob_size(sha) is None]
                sha = missing[0] if missing else tmps[0][0]
                raise FileNotFoundError(errno.ENOENT, f"blob {sha} is not in the store {self.url}",
                                        layout.blob_path(sha)) from None
            for (sha, _, _), digest in zip(tmps, digests, strict=True):
                if digest != sha:
                    raise ValueError(f"blob {self.url}/{layout.blob_path(sha)} hashes to {digest[:16]}..., not "
                                     f"{sha[:16]}... (rot or tampering)")
            for _, dest, tmp in tmps:
                os.replace(tmp, dest)
        finally:
            for _, _, tmp in tmps:
                tmp.unlink(missing_ok=True)

    # -- manifests --------------------------------------------------------------------------------
    def put_manifest(self, key: str, raw: dict[str, Any]) -> bool:
        return self.put_object(layout.manifest_path(key), json_bytes(raw), create_only=True)

    # -- action cache -------------------------------------------------------------------------------
    def lookup(self, key: str, deep: bool = False) -> Lookup:
        text = self.get_object(layout.manifest_path(key))
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
            except (StoreError, OSError) as e:  # e.g. credentials that may only read: report, never crash
                from neuron_build.log import get_logger
                get_logger(key=key[:12]).warning("damaged object not moved", reason=found.damage, error=str(e))
        return found

    def is_complete(self, key: str, deep: bool = False) -> bool:
        return self.lookup(key, deep).hit

    def is_cached(self, key: str) -> bool:
        return self.is_complete(key)

    def manifest(self, key: str) -> Manifest | None:
        return self.lookup(key).manifest

    def view_dir(self, key: str) -> Path:
        """Where :meth:`artifact_dir` puts the local copy of ``key`` (``<cache>/views/<key[:2]>/<key>``)."""
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
            FileNotFoundError: ``key`` has no manifest.
            ValueError: a blob does not hash to its name (nothing is left in the view).
            StoreError: a wire fault.
        """
        text = self.get_object(layout.manifest_path(key))
        if text is None:
            raise FileNotFoundError(errno.ENOENT, f"no artifact for key {key[:12]} in {self.url}")
        files = json.loads(text).get("files") or {}
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
            if not self._view_fresh(view, text, files):  # another process built it meanwhile: fine
                raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def keys(self) -> list[str]:
        out = []
        for rel in self.list_objects("ac"):
            parts = rel.split("/")
            if len(parts) == 3 and parts[2].endswith(".json") and is_key(parts[2][:-5]) and parts[2][:2] == parts[1]:
                out.append(parts[2][:-5])
        return sorted(out)

    def find_keys(self, prefix: str) -> list[str]:
        return sorted(rel.rsplit("/", 1)[-1][:-5] for rel in self.list_objects(f"ac/{prefix[:2]}")
                      if rel.endswith(".json") and rel.rsplit("/", 1)[-1].startswith(prefix)
                      and is_key(rel.rsplit("/", 1)[-1][:-5]))

    def manifests(self) -> Iterator[Manifest]:
        for key in self.keys():
            m = self.manifest(key)
            if m is not None:
                yield m

    def log_file(self, key: str, name: str) -> Path:
        """A local copy (in the cache, ``<cache>/logs/<key>/``) of the build log ``name`` of ``key``'s
        artifact, with the artifact's other logs beside it; the path may not exist when the store has no
        such log."""
        raw = self.raw_manifest(key) or {}
        for log in sorted(set(raw.get("logs") or {}) | {name}):
            data = self.get_object(layout.log_path(key, log))
            if data is not None:
                write_atomic(self.cache.path(layout.log_path(key, log)), data)
        return self.cache.path(layout.log_path(key, name))

    def new_staging(self, key: str) -> Path:
        """A fresh local folder in the cache (``<cache>/staging/<key>.<host>.<pid>.<token>``)."""
        self._writable()
        return self.cache.new_staging(key)

    def seal(self, folder: Path, manifest: Manifest) -> dict[str, Any]:
        return self.cache.seal(folder, manifest)

    def publish(self, folder: Path, key: str) -> Path:
        """Upload a sealed folder: every file as a blob (create-only), its logs under ``logs/<key>/``, then
        the manifest create-only (the commit point). A complete artifact already there is kept (the folder
        is discarded); a damaged manifest in the way is quarantined first. The uploaded files become the
        local view, so nothing is downloaded again.

        Returns:
            :meth:`artifact_dir` of ``key``.

        Raises:
            StoreError: a wire fault; the key is not committed (blobs already uploaded are harmless).
            ValueError: the folder has no manifest of ``key``, or a file does not match it.
        """
        self._writable()
        folder = Path(folder)
        text = (folder / MANIFEST).read_bytes()
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("key") != key:
            raise ValueError(f"{folder / MANIFEST} is not the manifest of key {key[:12]}")
        found = self.lookup(key)
        if found.hit:
            shutil.rmtree(folder, ignore_errors=True)
            return self.artifact_dir(key)
        if found.damage is not None:
            self.quarantine(key, found.damage)
        for name, ent in (raw.get("files") or {}).items():
            self.put_blob(ent["sha256"], folder / name)
        for name in raw.get("logs") or {}:
            src = folder / name
            if src.is_file():
                self.put_object(layout.log_path(key, name), src.read_bytes())
        if not self.put_manifest(key, raw) and not self.is_complete(key):
            self.repair(key)  # a damaged entry appeared between our check and our commit
            if not self.put_manifest(key, raw):
                raise StoreFailed(f"{self.url}: could not commit {layout.manifest_path(key)}: another writer "
                                  f"keeps replacing it; retry the build", self.url, True)
        stored = self.get_object(layout.manifest_path(key))
        files = raw.get("files") or {}
        if stored == text:  # ours won: the staged files are the view (the logs are no part of it)
            for name in raw.get("logs") or {}:
                (folder / name).unlink(missing_ok=True)
            self.view_dir(key).parent.mkdir(parents=True, exist_ok=True)
            try:
                self._swap_view(folder, self.view_dir(key), text, files)
            except OSError:
                pass
        shutil.rmtree(folder, ignore_errors=True)
        return self.artifact_dir(key)

    def _quarantine_copy(self, rel: str, name: str, reason: str) -> str:
        """Copy the object at ``rel`` to ``quarantine/<name>.<token>/`` with ``reason.txt`` (S3 has no
        rename: the caller deletes or replaces the original after this returns)."""
        dest = f"quarantine/{name}.{secrets.token_hex(4)}"
        inner = "manifest.json" if rel.startswith("ac/") else rel.rsplit("/", 1)[-1]
        with self._wire(f"quarantining {rel}", writing=True):
            self.io.copy(rel, f"{dest}/{inner}")
            self.io.write(f"{dest}/reason.txt", (reason + "\n").encode(), False)
        from neuron_build.log import get_logger
        get_logger(key=name[:12]).warning("object quarantined", reason=reason, moved_to=f"{self.url}/{dest}")
        return dest

    def quarantine(self, key: str, reason: str) -> str | None:
        """Copy ``key``'s manifest to ``quarantine/<key>.<token>/`` with ``reason``, then delete it from
        ``ac/`` (its blobs stay: other manifests and releases may pin them)."""
        self._writable()
        rel = layout.manifest_path(key)
        got = self.object_ref(rel)
        if got[0] is None:
            return None
        dest = self._quarantine_copy(rel, key, reason)
        with self._wire(f"deleting {rel}", writing=True):
            self.io.delete(rel)
        shutil.rmtree(self.view_dir(key), ignore_errors=True)
        return dest

    def quarantine_blob(self, sha256: str, reason: str) -> str | None:
        """Move blob ``sha256`` to ``quarantine/<sha>.<token>/`` with ``reason``; None when absent."""
        self._writable()
        rel = layout.blob_path(sha256)
        if self.blob_size(sha256) is None:
            return None
        dest = self._quarantine_copy(rel, sha256, reason)
        with self._wire(f"deleting {rel}", writing=True):
            self.io.delete(rel)
        return dest

    def clean_staging(self) -> int:
        return self.cache.clean_staging()

    # -- records ----------------------------------------------------------------------------------
    def _get_json(self, rel: str) -> Any | None:
        data = self.get_object(rel)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def _many_json(self, rels: list[str]) -> list[Any]:
        """The JSON of many objects (None where absent or unreadable), fetched concurrently where the
        filesystem can."""
        if not rels:
            return []
        with self._wire(f"reading {len(rels)} objects under {rels[0].split('/', 1)[0]}/"):
            got = self.io.fs.cat([self.io.full(r) for r in rels], on_error="return")
        if not isinstance(got, dict):
            got = {self.io.full(rels[0]): got}
        out = []
        for r in rels:
            v = got.get(self.io.full(r), got.get(self.io.fs._strip_protocol(self.io.full(r))))
            try:
                out.append(json.loads(v) if isinstance(v, bytes | str) else None)
            except ValueError:
                out.append(None)
        return out

    def put_target(self, record: TargetRecord) -> None:
        self.put_object(layout.target_path(record.target), json_bytes(record.to_json()))

    def target(self, target_id: str) -> TargetRecord | None:
        return TargetRecord.from_json(self._get_json(layout.target_path(target_id)))

    def _records(self, name: str, model: str | None, bucket_id: str | None) -> Iterator[tuple[str, Any]]:
        base = "targets" + (f"/{model}" if model is not None else "") + (
            f"/{bucket_id}" if model is not None and bucket_id is not None else "")
        rels = [r for r in self.list_objects(base) if r.rsplit("/", 1)[-1] == name]
        for rel, raw in zip(rels, self._many_json(rels), strict=True):
            yield rel[len("targets/"):].rsplit("/", 1)[0], raw

    def put_failure(self, record: FailureRecord, log: bytes) -> None:
        self.put_object(layout.target_path(record.target, "failure.log"), log)
        self.put_object(layout.target_path(record.target, "failure.json"), json_bytes(record.to_json()))

    def failure(self, target_id: str) -> FailureRecord | None:
        return FailureRecord.from_json(self._get_json(layout.target_path(target_id, "failure.json")))

    def failures(self, model: str, bucket_id: str | None = None) -> Iterator[FailureRecord]:
        for _, raw in self._records("failure.json", model, bucket_id):
            rec = FailureRecord.from_json(raw)
            if rec is not None:
                yield rec

    def failure_log(self, target_id: str) -> Path:
        """A local copy of the target's failure log (in the cache; absent when the store has none)."""
        local = self.cache.path(layout.target_path(target_id, "failure.log"))
        data = self.get_object(layout.target_path(target_id, "failure.log"))
        if data is None:
            local.unlink(missing_ok=True)
        else:
            write_atomic(local, data)
        return local

    def clear_failure(self, target_id: str) -> None:
        for name in ("failure.json", "failure.log"):
            rel = layout.target_path(target_id, name)
            if self.get_object(rel) is not None:
                self.delete_object(rel)

    def put_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> None:
        self.put_object(layout.result_path(key, kind, name), json_bytes(result))

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        return self._get_json(layout.result_path(key, kind, name))

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        rels = [r for r in self.list_objects(f"results/{key}/{kind}") if r.endswith(".json") and r.count("/") == 3]
        return {r.rsplit("/", 1)[-1][:-5]: v for r, v in zip(rels, self._many_json(rels), strict=True)
                if v is not None}

    # -- releases and channels ------------------------------------------------------------------------
    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        return self.put_object(layout.release_path(model, release_id), json_bytes(record), create_only=True)

    def release(self, model: str, release_id: str) -> dict[str, Any] | None:
        return self._get_json(layout.release_path(model, release_id))

    def release_ids(self, model: str, prefix: str = "") -> list[str]:
        return sorted(r.rsplit("/", 1)[-1][:-5] for r in self.list_objects(f"releases/{model}")
                      if r.count("/") == 2 and r.endswith(".json") and r.rsplit("/", 1)[-1].startswith(prefix))

    def releases(self, model: str | None = None) -> Iterator[tuple[str, str, Any]]:
        rels = [r for r in self.list_objects("releases" if model is None else f"releases/{model}")
                if r.count("/") == 2 and r.endswith(".json")]
        for rel, raw in zip(rels, self._many_json(rels), strict=True):
            _, m, name = rel.split("/")
            yield m, name[:-5], raw

    def channel(self, model: str, channel: str) -> dict[str, Any] | None:
        raw = self._get_json(layout.channel_path(model, channel))
        return raw if isinstance(raw, dict) else None

    def channels(self) -> Iterator[tuple[str, str, Any]]:
        rels = [r for r in self.list_objects("channels") if r.count("/") == 2 and r.endswith(".json")]
        for rel, raw in zip(rels, self._many_json(rels), strict=True):
            _, m, name = rel.split("/")
            yield m, name[:-5], raw

    def channel_ref(self, model: str, channel: str) -> tuple[dict[str, Any] | None, str | None]:
        """The pointer and its token (S3: the ETag; else the sha256 of its bytes). An unparsable pointer
        reads as (None, token), so a swap may replace it."""
        data, token = self.object_ref(layout.channel_path(model, channel))
        if data is None:
            return None, None
        try:
            ptr = json.loads(data)
        except ValueError:
            ptr = None
        return (ptr if isinstance(ptr, dict) else None), token

    def swap_channel(self, model: str, channel: str, pointer: dict[str, Any], expected: str | None) -> bool:
        return self.swap_object(layout.channel_path(model, channel), json_bytes(pointer), expected)

    def append_history(self, model: str, channel: str, entry: dict[str, Any]) -> None:
        """Write ``entry`` as a new object ``<history_dir>/<UTC time>-<token>.json``, create-only."""
        data = json.dumps(entry, sort_keys=False, default=str).encode() + b"\n"
        while not self.put_object(f"{layout.history_dir(model, channel)}/{utc_now_us()}-{secrets.token_hex(4)}.json",
                                  data, create_only=True):
            pass  # a token collision: draw another

    def history(self, model: str, channel: str) -> list[dict[str, Any]]:
        rels = [r for r in self.list_objects(layout.history_dir(model, channel)) if r.endswith(".json")]
        return [e for e in self._many_json(rels) if isinstance(e, dict)]

    # -- builders that share the store ----------------------------------------------------------------
    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0) -> LeaseLock:
        """The compile lock of ``key`` across hosts: a :class:`LeaseLock` on ``leases/<key>.json``."""
        return LeaseLock(self, key, target=target, heartbeat_s=heartbeat_s)

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0):
        """The host-memory ledger of this host (in the cache folder: host memory is no shared thing)."""
        return self.cache.memory_budget(max_bytes, heartbeat_s=heartbeat_s)


# ------------------------------------------------------------------------------------------------------
# leases

class LeaseLock:
    """The exclusive compile lock of one key across hosts: a lease object ``leases/<key>.json`` holding its
    owner (host, pid, process start, a random token, target, since) and its expiry (``expires``, seconds
    since the epoch). The same interface as :class:`~neuron_build.store.locks.KeyLock`.

    Taken create-only; renewed by a heartbeat thread every quarter of ``ttl_s`` through compare-and-swap
    on its token (S3: the ETag); released on exit by a conditional delete. A lease that expired (its
    holder died or lost the network) or whose owner is dead on this host is taken over by
    compare-and-swap, so of two waiters exactly one wins. A holder whose renewal fails logs it and keeps
    compiling; a rival can take the lease only after it has expired.

    Args:
        store: the :class:`RemoteStore`.
        key: the artifact key.
        target: the target id (informational, in the lease).
        poll_s: seconds between attempts while waiting.
        heartbeat_s: seconds between "still waiting for lock" events.
        ttl_s: seconds a lease lasts without renewal.

    Attributes after entering:
        waited_s: seconds spent waiting. waited_for: the lease of the holder it waited for (or None).
        stale: leases of dead or expired holders that it took over.
    """

    def __init__(self, store: RemoteStore, key: str, target: str = "", poll_s: float = 0.2,
                 heartbeat_s: float = 15.0, ttl_s: float = LEASE_TTL_S):
        from neuron_build.log import get_logger
        self.store, self.key, self.target = store, key, target
        self.path = f"{store.url}/{layout.lease_path(key)}"
        self.rel = layout.lease_path(key)
        self.poll_s, self.heartbeat_s, self.ttl_s = poll_s, heartbeat_s, ttl_s
        self.waited_s = 0.0
        self.waited_for: dict[str, Any] | None = None
        self.stale: list[dict[str, Any]] = []
        self._token = secrets.token_hex(8)
        self._etag: str | None = None
        self._held = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._mutex = threading.Lock()
        self._log = get_logger(target=target or None, key=key[:12])

    def _lease(self) -> bytes:
        from neuron_build.store.locks import _me
        return json_bytes(_me(token=self._token, key=self.key, target=self.target,
                              expires=time.time() + self.ttl_s, ttl_s=self.ttl_s))

    def owner(self) -> dict[str, Any] | None:
        """The current lease, or None."""
        data = self.store.get_object(self.rel)
        try:
            rec = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) else None

    def _ref(self) -> tuple[dict[str, Any] | None, str | None, bool]:
        data, token = self.store.object_ref(self.rel)
        if data is None:
            return None, None, False
        try:
            rec = json.loads(data)
        except ValueError:
            return None, token, True
        return (rec if isinstance(rec, dict) else None), token, True

    def acquire(self) -> LeaseLock:
        from neuron_build.store.locks import _who, owner_alive
        t0 = time.monotonic()
        next_beat = None
        while True:
            data = self._lease()
            if self.store.put_object(self.rel, data, create_only=True):
                _, self._etag = self.store.object_ref(self.rel)
                break
            rec, token, present = self._ref()
            if not present:
                continue  # released between our two calls: try again at once
            if rec is not None and rec.get("token") == self._token:  # ours: the answer to our put was lost
                self._etag = token
                break
            expired = rec is None or not isinstance(rec.get("expires"), int | float) or rec["expires"] < time.time()
            dead = rec is not None and owner_alive(rec) is False
            if expired or dead:
                if self.store.swap_object(self.rel, data, token):
                    _, self._etag = self.store.object_ref(self.rel)
                    self.stale.append(rec or {})
                    self._log.warning("took over a stale compile lease", **_who(rec),
                                      why="expired" if expired else "its owner is dead on this host")
                    break
                continue
            now = time.monotonic()
            if next_beat is None:
                self.waited_for = rec
                self._log.info("waiting for lock", **_who(rec), lock=self.path)
                next_beat = now + self.heartbeat_s
            elif now >= next_beat:
                self._log.info("still waiting for lock", waited_s=round(now - t0), **_who(rec))
                next_beat = now + self.heartbeat_s
            time.sleep(self.poll_s)
        self.waited_s = time.monotonic() - t0
        self._held = True
        self._stop.clear()
        self._beat = threading.Thread(target=self._renew_loop, name=f"lease-{self.key[:12]}", daemon=True)
        self._beat.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with self._mutex:
                if not self._held:
                    return
                try:
                    if self.store.swap_object(self.rel, self._lease(), self._etag):
                        _, self._etag = self.store.object_ref(self.rel)
                    else:
                        self._log.warning("compile lease lost (another builder took it over)", lock=self.path)
                        self._held = False
                        return
                except StoreError as e:
                    self._log.warning("could not renew the compile lease", error=str(e), lock=self.path)

    def abandon(self) -> None:
        """Stop renewing the lease without a call to the store (which cannot be reached): it expires
        ``ttl_s`` after its last renewal."""
        self._stop.set()
        self._held = False  # (no mutex: a renewal stuck on the wire must not hold this up)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        with self._mutex:
            if not self._held:
                return
            self._held = False
            try:
                if self._etag is not None:
                    self.store.delete_object_if(self.rel, self._etag)
            except StoreError as e:  # it expires by itself
                self._log.warning("could not release the compile lease", error=str(e), lock=self.path)

    def __enter__(self) -> LeaseLock:
        return self if self._held else self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


__all__ = ["CONNECT_TIMEOUT_S", "LEASE_TTL_S", "RETRIES", "LeaseLock", "RemoteStore", "cache_root",
           "clear_client_cache", "is_url", "wire_error"]
