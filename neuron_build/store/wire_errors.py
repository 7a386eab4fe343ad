"""Faults on the wire: what s3fs, boto3 and fsspec raise, mapped to one-line
:class:`~neuron_build.errors.StoreError` subclasses naming the URL and the fix (``writing`` tells a failed
read, which a read-through cache fails open on, from a failed write).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from neuron_build.errors import StoreDenied, StoreError, StoreFailed, StoreMissing, StoreUnreachable

#: Attempts per request when the caller does not say (botocore ``standard`` mode's default here).
DEFAULT_ATTEMPTS = 4


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def wire_error(exc: BaseException, url: str, what: str, writing: bool, endpoint: str | None = None,
               attempts: int = DEFAULT_ATTEMPTS) -> StoreError | None:
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
    if is_missing_bucket(exc):
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


def is_missing_bucket(exc: BaseException) -> bool:
    """Does ``exc`` (or an exception in its cause/context chain: s3fs wraps botocore's ``ClientError`` in
    an OSError) say the bucket does not exist (S3 error code ``NoSuchBucket``)?"""
    for e in _chain(exc):
        resp = getattr(e, "response", None)
        code = ((resp.get("Error") or {}).get("Code") if isinstance(resp, dict) else None)
        if code == "NoSuchBucket" or "specified bucket does not exist" in str(e).lower():
            return True
    return False


@contextmanager
def wire(url: str, what: str, writing: bool = False, endpoint: str | None = None,
         attempts: int = DEFAULT_ATTEMPTS) -> Iterator[None]:
    """Turn a client library's exception inside the block into a :class:`~neuron_build.errors.StoreError`
    (see :func:`wire_error`); other exceptions of botocore, aiohttp, urllib3 or s3fs become a
    :class:`~neuron_build.errors.StoreFailed`; the rest (an absent object, a ValueError) pass unchanged."""
    try:
        yield
    except Exception as e:
        err = wire_error(e, url, what, writing, endpoint, attempts)
        if err is not None:
            raise err from None
        if type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "urllib3", "s3fs"):
            raise StoreFailed(f"{url}: {type(e).__name__} ({what}: {e}); retry, or run with --debug "
                              f"for details", url, writing) from e
        raise


__all__ = ["is_missing_bucket", "wire", "wire_error"]
