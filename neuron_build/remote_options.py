"""``[build] remote_options``: the keys neuron-build takes out for its S3 clients, their bounds, and the check
of a whole options table at once (torch-free, no S3 package imported unless an unknown key must be looked up).

The config checks every option when ``buckets.toml`` loads (each fault one line naming
``build.remote_options`` and the key: :mod:`neuron_build.project.config_checks`); a store opened with options
from elsewhere (a Dask worker's store spec) is checked again when it opens
(:class:`neuron_build.store.remote.RemoteStore`). Every fault is reported in one run.

S3's limits [AWS doc: "Amazon S3 multipart upload limits",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html]: a part is 5 MiB to 5 GiB (the last part
may be smaller), at most 10,000 parts per upload; one ``PutObject`` uploads at most 5 GB and one
``CopyObject`` copies at most 5 GB [AWS doc: "Uploading objects"; API reference, "CopyObject"] (taken as
5 GiB, as the part limit). An upload of more than 10,000 parts of ``multipart_chunksize`` gets larger parts
(:func:`neuron_build.store.transfer.part_size`): 10,000 parts of at most 5 GiB hold 50 TiB, more than S3's
largest object (48.8 TiB), so no bound on the part count is left to the user.
"""

from __future__ import annotations

import difflib
from typing import Any

MIB, GIB = 1 << 20, 1 << 30
#: S3's smallest part (all but the last) and its largest [AWS doc: multipart upload limits].
MIN_PART, MAX_PART = 5 * MIB, 5 * GIB
#: S3's most parts per upload [AWS doc: multipart upload limits].
MAX_PARTS = 10_000
#: The largest object one ``PutObject`` uploads and one ``CopyObject`` copies: 5 GB [AWS doc], as 5 GiB.
MAX_SINGLE = 5 * GIB
#: The most requests of one object in flight: a download's range reads run in a process-wide pool of this many
#: threads (:mod:`neuron_build.store.ranged`), so a higher ``max_concurrency`` would put no more in flight,
#: only hold more ranges in memory (up to ``2 * max_concurrency`` of ``multipart_chunksize`` bytes). S3 itself
#: serves 3,500 PUT and 5,500 GET requests a second per prefix [AWS doc: "Best practices design patterns:
#: optimizing Amazon S3 performance"], far above what one host's 32 requests at a time ask.
MAX_CONCURRENCY = 32

#: ``[build] remote_options`` keys that are neuron-build's (taken out before the options reach fsspec), with
#: their defaults: seconds, seconds, requests, bytes, bytes, requests, bytes (s3transfer's defaults for the
#: transfer keys; the copy threshold is the largest single ``CopyObject``).
DEFAULTS: dict[str, int | float] = {
    "connect_timeout_s": 5.0, "read_timeout_s": 30.0, "attempts": 4, "multipart_threshold": 8 * MIB,
    "multipart_chunksize": 8 * MIB, "max_concurrency": 10, "multipart_copy_threshold": MAX_SINGLE}
OPTION_KEYS: tuple[str, ...] = tuple(DEFAULTS)

#: whole-number keys: (least, most, what the bound is)
_WHOLE: dict[str, tuple[int, int | None, str]] = {
    "attempts": (1, None, ""),
    "multipart_threshold": (1, MAX_SINGLE, "the largest single PutObject"),
    "multipart_chunksize": (MIN_PART, MAX_PART, "S3's part sizes"),
    "max_concurrency": (1, MAX_CONCURRENCY, "the range-read threads of a download"),
    "multipart_copy_threshold": (MIN_PART, MAX_SINGLE, "S3's CopyObject limit"),
}


def _size(n: int) -> str:
    return f"{n} ({n // GIB} GiB)" if n % GIB == 0 else f"{n} ({n // MIB} MiB)" if n % MIB == 0 else str(n)


def value_fault(name: str, value: Any, shown: str | None = None) -> str | None:
    """Why ``value`` is no value of neuron-build's option ``name`` (one line: ``name = value is ...; give e.g.
    name = <default>``), or None when it is one. ``shown``: the key the user wrote, when it is botocore's
    spelling of the same setting (``config_kwargs.read_timeout``)."""
    key = shown or name
    fix = f"give e.g. {key} = {DEFAULTS[name]}"
    if name in _WHOLE:
        least, most, why = _WHOLE[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
            bound = f">= {least}" if most is None else f"from {_size(least)} to {_size(most)}, {why}"
            return f"{key} = {value!r} is not a whole number {bound}; {fix}"
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return f"{key} = {value!r} is not a positive number of seconds; {fix}"
    return None


def known_option_keys(url: str) -> set[str]:
    """The ``[build] remote_options`` keys a store at ``url`` takes: :data:`OPTION_KEYS` and the storage options
    of the URL's fsspec file system (its class's ``__init__`` up the MRO, fsspec's own cache options; for
    ``s3://``, ``s3fs.S3FileSystem``'s and aiobotocore's ``AioSession``'s, e.g. ``profile``). Empty when the
    file system class cannot be looked up (then nothing is refused)."""
    import fsspec

    proto = url.partition("://")[0] if "://" in url else "file"
    try:
        cls = fsspec.get_filesystem_class("s3" if proto == "s3a" else proto)
    except (ImportError, ValueError):
        return set()
    keys = _init_keys(cls) | set(_FSSPEC_COMMON) | set(OPTION_KEYS)
    if proto in ("s3", "s3a"):
        from aiobotocore.session import AioSession

        keys |= _init_keys(AioSession)
    return keys


#: fsspec's storage options of every file system (its instance cache and listings cache).
_FSSPEC_COMMON = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths")


def _init_keys(cls: type) -> set[str]:
    """The keyword parameters of ``cls.__init__`` and of its bases' (up the MRO while one takes ``**kwargs``)."""
    import inspect

    keys: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        keys |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return keys


def _unknown_faults(url: str, options: dict[str, Any]) -> list[str]:
    """One line per key the store at ``url`` does not take (fsspec would accept it silently and ignore it),
    each with the closest known key; the first also lists the known keys."""
    if all(k in OPTION_KEYS for k in options):
        return []  # (nothing to look up: the S3 packages stay unimported)
    known = known_option_keys(url)
    unknown = [k for k in options if known and k not in known]
    faults = []
    for k in unknown:
        close = difflib.get_close_matches(k, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if k in ("region", "region_name") and "client_kwargs" in known:
            hint = " (the region goes in client_kwargs = { region_name = \"...\" })"
        faults.append(f"unknown key {k!r} for {url}{hint}")
    if faults:
        faults[0] += (f"; the keys are {', '.join(OPTION_KEYS)} and the storage options of fsspec's "
                      f"{url.partition('://')[0]}:// file system: {', '.join(sorted(known - set(OPTION_KEYS)))}")
    return faults


def wire_values(options: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """neuron-build's settings in a ``[build] remote_options`` table and the faults of their values.

    botocore's ``config_kwargs`` (``connect_timeout``, ``read_timeout``, ``retries`` with ``total_max_attempts``
    or ``max_attempts``, the retries after the first request) win over the ``*_s`` keys, as a user who wrote
    them expects; a fault names the key as written.

    Returns:
        (setting -> value, for the keys given and valid; one line per value out of its bounds).
    """
    opts = dict(options or {})
    got: dict[str, Any] = {name: opts[name] for name in OPTION_KEYS if name in opts}
    shown: dict[str, str] = {}  # our key -> botocore's spelling the user wrote instead
    faults = []
    cfg = opts.get("config_kwargs") or {}
    if isinstance(cfg, dict):
        for ours, theirs in (("connect_timeout_s", "connect_timeout"), ("read_timeout_s", "read_timeout")):
            if cfg.get(theirs) is not None:
                got[ours], shown[ours] = cfg[theirs], f"config_kwargs.{theirs}"
        retries = cfg.get("retries")
        if isinstance(retries, dict) and retries.get("total_max_attempts") is not None:
            got["attempts"], shown["attempts"] = retries["total_max_attempts"], "config_kwargs.retries.total_max_attempts"
        elif isinstance(retries, dict) and retries.get("max_attempts") is not None:
            n = retries["max_attempts"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                faults.append(f"config_kwargs.retries.max_attempts = {n!r} is not a whole number >= 0; give e.g. "
                              f"config_kwargs.retries.max_attempts = 3")
                got.pop("attempts", None)
            else:
                got["attempts"] = n + 1
    bad = {name: f for name, value in got.items() if (f := value_fault(name, value, shown.get(name)))}
    return {k: v for k, v in got.items() if k not in bad}, faults + list(bad.values())


def option_faults(url: str | None, options: dict[str, Any] | None) -> list[str]:
    """Every fault of a ``[build] remote_options`` table for a store at ``url``, one line each: keys the store
    does not take (looked up only when a key is not neuron-build's; ``url`` None: not looked up), then values
    of neuron-build's settings out of their bounds (:func:`wire_values`). Empty when the options are sound."""
    opts = dict(options or {})
    return (_unknown_faults(url, opts) if url else []) + wire_values(opts)[1]


def check_options(url: str, options: dict[str, Any] | None) -> None:
    """Raise one :class:`~neuron_build.errors.UserError` listing every fault of :func:`option_faults` (a
    store opened with options the config did not check: a Dask worker's store spec, a test).

    Raises:
        UserError: ``[build] remote_options: <fault>; <fault>...``, one line.
    """
    faults = option_faults(url, options)
    if faults:
        from neuron_build.errors import UserError
        raise UserError("[build] remote_options: " + "; ".join(faults))


__all__ = ["DEFAULTS", "GIB", "MAX_CONCURRENCY", "MAX_PART", "MAX_PARTS", "MAX_SINGLE", "MIB", "MIN_PART",
           "OPTION_KEYS", "check_options", "known_option_keys", "option_faults", "value_fault", "wire_values"]
