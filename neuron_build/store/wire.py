"""Every call to a remote store bounded: timeouts and retries of the S3 clients, and the bound they put on
a build whose pushes cannot finish.

Both S3 clients of a :class:`~neuron_build.store.remote.RemoteStore` (s3fs over aiobotocore/aiohttp for
blobs, listings and reads; boto3 over urllib3 for the small objects whose ETag matters) get the same
:class:`WireSettings`:

- ``connect_timeout_s``: seconds to open a TCP connection to the endpoint;
- ``read_timeout_s``: seconds without a byte of the answer (botocore's ``read_timeout``), and seconds
  without progress of a request body being sent (:class:`WatchedSession`): aiohttp starts its read timer
  only once a body has been written, so without this watchdog an upload into a network that stopped
  taking bytes waits forever, however short ``read_timeout`` is (measured here: an 8 MiB blob through a
  black hole with ``read_timeout = 2`` was still waiting after 60 s);
- ``attempts``: requests per call, the first included (botocore ``standard`` retry mode: connection errors,
  timeouts, 5xx and throttling are retried with exponential backoff and jitter); s3fs's own retry loop is
  turned off so the two do not multiply.

Large objects go up and down in parts, several at once (:mod:`neuron_build.store.transfer`,
:mod:`neuron_build.store.ranged`); every part gets the same bounds, and the parts of one object are in
flight together, so they time out together.

They are set in ``[build] remote_options`` (seconds; all optional), with the transfer settings (bytes,
bytes, parts at once; s3transfer's defaults)::

    remote_options = { connect_timeout_s = 5, read_timeout_s = 30, attempts = 4,
                       multipart_threshold = 8388608, multipart_chunksize = 8388608, max_concurrency = 10,
                       multipart_copy_threshold = 5368709120 }

and taken out of the options before the rest is given to fsspec. botocore's own ``config_kwargs``
(``connect_timeout``, ``read_timeout``, ``retries``) still work and win over these.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass
from typing import Any

from neuron_build.remote_options import DEFAULTS, MAX_SINGLE, MIB, OPTION_KEYS, wire_values

#: botocore's standard-mode backoff before retry n (1-based) is at most min(2 ** (n - 1), 20) seconds.
MAX_BACKOFF_S = 20.0
#: Bytes a watched request body hands to aiohttp at a time (progress is seen per piece).
PIECE = 64 * 1024


@dataclass(frozen=True)
class WireSettings:
    """Timeouts and retries of every call to a remote store (S3).

    Attributes:
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: seconds without a byte of the answer, or without progress of a body being sent.
        attempts: requests per call, the first included (>= 1).
    """

    connect_timeout_s: float = DEFAULTS["connect_timeout_s"]
    read_timeout_s: float = DEFAULTS["read_timeout_s"]
    attempts: int = int(DEFAULTS["attempts"])
    #: bytes from which an object goes up as a multipart upload (:mod:`neuron_build.store.transfer`); at most
    #: :data:`~neuron_build.remote_options.MAX_SINGLE`, the largest single ``PutObject``
    multipart_threshold: int = 8 * MIB
    #: bytes of one part of an upload and of one ranged GET of a download (S3's parts: 5 MiB to 5 GiB)
    multipart_chunksize: int = 8 * MIB
    #: parts (or ranges) of one object in flight at once (at most :data:`~neuron_build.remote_options.MAX_CONCURRENCY`)
    max_concurrency: int = 10
    #: bytes from which a blob's refresh (a copy onto itself) is a multipart copy (``UploadPartCopy``, parts of
    #: ``multipart_chunksize``); at most :data:`~neuron_build.remote_options.MAX_SINGLE`, the largest a single
    #: ``CopyObject`` copies
    multipart_copy_threshold: int = MAX_SINGLE

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> tuple[WireSettings, dict[str, Any]]:
        """The settings in ``[build] remote_options`` and the options left for fsspec.

        botocore's ``config_kwargs`` (``connect_timeout``, ``read_timeout``, ``retries`` with
        ``total_max_attempts`` or ``max_attempts``) win over the ``*_s`` keys, as a user who wrote them
        expects.

        Raises:
            UserError: every setting out of its bounds (:func:`neuron_build.remote_options.wire_values`), in
                one line.
        """
        got, faults = wire_values(options)
        if faults:
            from neuron_build.errors import UserError
            raise UserError("[build] remote_options: " + "; ".join(faults))
        rest = {k: v for k, v in (options or {}).items() if k not in OPTION_KEYS}
        return cls(**got), rest

    # -- the clients' configuration --------------------------------------------------------------------
    def retries(self) -> dict[str, Any]:
        """botocore's ``retries`` option: ``standard`` mode, :attr:`attempts` in all."""
        return {"total_max_attempts": self.attempts, "mode": "standard"}

    def botocore_config(self) -> dict[str, Any]:
        """``botocore.config.Config`` keyword arguments (the boto3 client)."""
        return {"connect_timeout": self.connect_timeout_s, "read_timeout": self.read_timeout_s,
                "retries": self.retries()}

    def aiobotocore_config(self) -> dict[str, Any]:
        """s3fs ``config_kwargs`` (``aiobotocore.config.AioConfig``): :meth:`botocore_config` and the
        upload watchdog (:class:`WatchedSession`)."""
        return {**self.botocore_config(), "http_session_cls": watched_session()}

    # -- bounds (seconds) ------------------------------------------------------------------------------
    def backoff_s(self) -> float:
        """The most botocore sleeps between the attempts of one call."""
        return sum(min(2.0 ** (n - 1), MAX_BACKOFF_S) for n in range(1, self.attempts))

    def attempt_bound_s(self) -> float:
        """The longest one request waits on a network that went dark: connecting, then either no
        progress of its body or no byte of its answer."""
        return self.connect_timeout_s + self.read_timeout_s

    def call_bound_s(self) -> float:
        """The longest one call (all its attempts and the backoff between them) waits on a dark network."""
        return self.attempts * self.attempt_bound_s() + self.backoff_s()

    def push_bound_s(self) -> float:
        """The longest a build job waits on a dark network before it gives the remote up: two calls (a
        multipart upload's part, then its abort); the rest of the build skips the remote."""
        return 2 * self.call_bound_s()

    def describe(self) -> str:
        """One line: the settings and the bound they give."""
        return (f"connect {self.connect_timeout_s:g} s, read {self.read_timeout_s:g} s, {self.attempts} attempts "
                f"per call: a call ends within {self.call_bound_s():g} s, a push that cannot finish within "
                f"{self.push_bound_s():g} s")


def _whole(value: Any, name: str, least: int, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        from neuron_build.errors import UserError
        bound = f">= {least}" if most is None else f"from {least} to {most} (S3's CopyObject limit)"
        raise UserError(f"[build] remote_options: {name} = {value!r} is not a whole number {bound}; "
                        f"give e.g. {name} = {getattr(WireSettings, name)}")
    return value


# ------------------------------------------------------------------------------------------------------
# the upload watchdog

def _session_base() -> type:
    from aiobotocore.httpsession import AIOHTTPSession
    return AIOHTTPSession


class _Progress:
    """When a watched body last handed bytes on, and whether it is all sent (loop time, seconds)."""

    def __init__(self, now: float):
        self.last = now
        self.pieces = 0
        self.done = False


class _WatchedBody:
    """A request body given to aiohttp :data:`PIECE` bytes at a time; each piece asked for is progress
    (aiohttp asks for the next one once the previous one left its buffer)."""

    def __init__(self, body: Any, progress: _Progress, loop: asyncio.AbstractEventLoop):
        self.body, self.progress, self.loop = body, progress, loop

    async def _pieces(self):
        body = self.body
        if isinstance(body, io.IOBase):
            while piece := body.read(PIECE):
                self._moved()
                yield piece
        else:
            view = memoryview(body)
            for at in range(0, len(view), PIECE):
                self._moved()
                yield bytes(view[at:at + PIECE])
        self._moved()
        self.progress.done = True

    def _moved(self) -> None:
        self.progress.last = self.loop.time()
        self.progress.pieces += 1

    def __aiter__(self):
        return self._pieces()


def _watched_send_class() -> type:
    base = _session_base()

    class WatchedSession(base):  # type: ignore[misc, valid-type]
        """aiobotocore's HTTP session, with a watchdog on request bodies: a body that makes no progress for
        the read timeout (``read_timeout_s``) fails the attempt with botocore's ``ReadTimeoutError``, which
        botocore retries like any read timeout. Bodies below one :data:`PIECE` are left alone (the socket
        buffer takes them whole, then the read timeout applies)."""

        async def send(self, request):
            body = request.body
            stall = self._timeout.sock_read
            size = _size(body)
            if not stall or size is None or size <= PIECE:
                return await super().send(request)
            loop = asyncio.get_running_loop()
            if isinstance(body, io.IOBase):
                start = body.tell()
            progress = _Progress(loop.time())
            request.body = _WatchedBody(body, progress, loop)
            task = asyncio.ensure_future(super().send(request))
            try:
                while True:
                    allowed = stall + ((self._timeout.sock_connect or 0) if progress.pieces == 0 else 0)
                    left = progress.last + allowed - loop.time()
                    if progress.done:
                        return await task
                    if left <= 0:
                        task.cancel()
                        try:
                            await task
                        except BaseException:  # (any error:) the cancelled attempt's own error
                            pass
                        from botocore.exceptions import ReadTimeoutError
                        raise ReadTimeoutError(endpoint_url=request.url,
                                               error=f"no progress sending the request body for {stall:g} s")
                    done, _ = await asyncio.wait({task}, timeout=left)
                    if done:
                        return task.result()
            finally:
                request.body = body
                if isinstance(body, io.IOBase):
                    body.seek(start)

    WatchedSession.__qualname__ = WatchedSession.__name__ = "WatchedSession"
    return WatchedSession


def _size(body: Any) -> int | None:
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    if isinstance(body, io.IOBase) and body.seekable():
        here = body.tell()
        end = body.seek(0, io.SEEK_END)
        body.seek(here)
        return end - here
    return None


_WATCHED: list[type] = []


def watched_session() -> type:
    """The :class:`WatchedSession` class (made on first use: aiobotocore is imported only for an s3://
    store)."""
    if not _WATCHED:
        _WATCHED.append(_watched_send_class())
    return _WATCHED[0]


__all__ = ["WireSettings", "watched_session"]
