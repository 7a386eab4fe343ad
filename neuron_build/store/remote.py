"""A store at a URL (``s3://bucket/prefix``, ``memory://name``, ``file:///path``, any fsspec URL): the
one implementation (:class:`~neuron_build.store.core.Store`) over an fsspec medium
(:mod:`neuron_build.store.medium_fsspec`), holding the shared layout of :mod:`neuron_build.store.layout`
under the URL's prefix, and the S3 clients it is made with.

S3 has no rename, so an artifact is published without one (the order every trusted remote cache uses,
``docs/store.md``, "Sharing a store: S3 and many hosts"): every blob create-only
(``If-None-Match: *``), then the manifest, also create-only: the commit point. Channels move by
compare-and-swap on the pointer's ETag (``If-Match``). The compile lock of a key is a lease object
(:class:`~neuron_build.store.locks.LeaseLock`). Staging folders, views and the host-memory ledger are
host-local, in a :class:`~neuron_build.store.local.LocalStore` in this store's local cache folder
(``$XDG_CACHE_HOME`` or ``~/.cache``, then ``neuron-build/remote/<sha256 of the URL>/``).

Faults on the wire are raised as :class:`~neuron_build.errors.StoreError` subclasses
(:mod:`neuron_build.store.wire_errors`). Retries with backoff are botocore's (``standard`` mode,
:meth:`WireSettings.retries <neuron_build.store.wire.WireSettings.retries>`); s3fs's own retry loop is turned off so the two do not multiply. Every call is bounded (timeouts, attempts, an
upload watchdog): :mod:`neuron_build.store.wire`. s3fs and boto3 are imported only when an
``s3://`` store is opened (the ``s3`` extra).
"""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

from neuron_build.remote_options import check_options
from neuron_build.store.aws_profile import check_profile
from neuron_build.store.core import Store
from neuron_build.store.local import LocalStore
from neuron_build.store.medium_fsspec import FsspecMedium, fsspec_medium
from neuron_build.store.medium_s3 import S3Medium
from neuron_build.store.wire import WireSettings
from neuron_build.util import sha256_hex


def cache_root(url: str) -> Path:
    """The local cache folder of the store at ``url``: ``$XDG_CACHE_HOME`` (or ``~/.cache``) +
    ``neuron-build/remote/<sha256 of the URL, 16 hex chars>``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-build" / "remote" / sha256_hex(url.encode())[:16]


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
    the retries and timeouts of :class:`~neuron_build.store.wire.WireSettings`. Credentials and the endpoint come from the standard AWS variables
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
    check_profile(url, options)  # a missing AWS profile: one line (exit 2), not botocore's ProfileNotFound
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
    fs.retries = 1  # botocore retries (WireSettings.retries); s3fs's own loop would multiply them
    session = boto3.session.Session(profile_name=aio.profile, aws_access_key_id=opts.get("key"),
                                    aws_secret_access_key=opts.get("secret"), aws_session_token=opts.get("token"))
    session._session.register_component("data_loader", _LOADER)
    client = session.client("s3", endpoint_url=endpoint, region_name=client_kwargs.get("region_name"),
                            config=Config(**{k: v for k, v in cfg.items() if k != "http_session_cls"}))
    made = (fs, client, endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    with _CLIENTS_LOCK:
        return _CLIENTS.setdefault(ident, made)


class RemoteStore(Store):
    """A store at a URL. Implements :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        url: ``s3://bucket/prefix``, ``memory://name``, ``file:///path`` or any fsspec URL.
        options: fsspec storage options (``[build] remote_options``), e.g. ``{"profile": "ci"}`` or
            ``{"endpoint_url": "http://minio:9000"}`` for S3.
        read_only: never write: every writing method raises
            :class:`~neuron_build.store.core.ReadOnlyStore`; :meth:`repair` only reports.
        cache_dir: the local cache folder (default :func:`cache_root` of the URL).

    Attributes:
        location, url: the URL (for messages).
        cache: the :class:`~neuron_build.store.local.LocalStore` in the cache folder (staging, views, the
            host-memory ledger).
        io: the medium (an :class:`~neuron_build.store.medium_fsspec.FsspecMedium`).

    Raises:
        UserError: an ``s3://`` URL without s3fs and boto3 installed, or a URL fsspec does not know.
    """

    def __init__(self, url: str, options: dict[str, Any] | None = None, read_only: bool = False,
                 cache_dir: str | Path | None = None):
        self.url = url.rstrip("/")
        self.options = copy.deepcopy(dict(options or {}))  # botocore rewrites a retries dict in place
        proto, _, rest = self.url.partition("://")
        check_options(self.url, self.options)  # every unknown key and bad value, in one line
        #: timeouts and retries of every call (:mod:`neuron_build.store.wire`); ``fs_options``: the rest
        self.wire, fs_options = WireSettings.from_options(self.options)
        #: attempts the client library makes per request (botocore's total_max_attempts), for messages
        self.attempts = self.wire.attempts
        self.endpoint: str | None = None
        if proto in ("s3", "s3a"):
            fs, client, self.endpoint = _s3_clients(self.url, self.options)
            medium: FsspecMedium = S3Medium(fs, rest, self.url, client, self.endpoint, self.attempts)
            medium.settings = self.wire
        else:
            medium = fsspec_medium(self.url, fs_options)
        self.io = medium
        cache = Path(cache_dir) if cache_dir else cache_root(self.url)
        if isinstance(medium, S3Medium):  # the host's processes upload a large blob once
            medium.lock_dir = cache / ".upload-locks"
        super().__init__(medium, self.url, read_only, cache=LocalStore(cache))


__all__ = ["RemoteStore", "cache_root", "clear_client_cache"]
