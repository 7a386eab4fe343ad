"""Small helpers every layer shares: atomic files, digests, canonical JSON, times and percentiles.

The one place that writes a file "temporary name, fsync, rename" (:func:`write_atomic`), so a reader sees
the old content or the new, never a torn file; the one percentile (:func:`percentile`).
No torch, no pydantic: this module is on the no-op build's path.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import math
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

#: errno values that mean the file system is full (ENOSPC) or the user's quota is used up (EDQUOT).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that says the file system (or quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


# -- files -------------------------------------------------------------------------------------------

def fsync_path(path: Path) -> None:
    """fsync a file or a folder (so a rename or a new entry in it survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: Path) -> Path:
    """A private temporary name beside ``path``: ``.<name>.<pid>.<token>.tmp`` (``gc`` removes ones
    older than an hour: they were left by a killed writer)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def write_atomic(path: Path, data: bytes, *, create_only: bool = False) -> bool:
    """Write ``data`` to ``path`` through a temporary file in the same folder, fsynced, then renamed.

    Args:
        create_only: never replace an existing ``path``: the temporary file is hard-linked to ``path``
            (which fails when the name exists), so a record written once is never replaced.

    Returns:
        True when ``path`` now holds ``data``; False only with ``create_only`` when ``path`` existed.

    Raises:
        OSError: e.g. ENOSPC; no temporary file is left behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return commit_temp(tmp, path, create_only)
    finally:
        tmp.unlink(missing_ok=True)


def commit_temp(tmp: Path, path: Path, create_only: bool) -> bool:
    """Give the complete, fsynced file ``tmp`` the name ``path``: renamed over it, or with ``create_only``
    hard-linked to it (which fails when the name exists, so what was written once is never replaced). The
    caller removes ``tmp`` afterwards (a link leaves it behind).

    Returns:
        True when ``path`` now holds ``tmp``'s bytes; False only with ``create_only`` when ``path`` existed.
    """
    if not create_only:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    return True


def json_bytes(obj: Any) -> bytes:
    """The project's JSON file form: indented by 2, one trailing newline."""
    return (json.dumps(obj, indent=2, default=str) + "\n").encode()


def write_json_atomic(path: Path, obj: Any, *, create_only: bool = False) -> bool:
    """:func:`write_atomic` of ``obj`` as indented JSON; same arguments and result."""
    return write_atomic(path, json_bytes(obj), create_only=create_only)


def read_json(path: Path) -> Any | None:
    """JSON content of ``path``, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def append_line(path: Path, line: str) -> None:
    """Append one line to ``path`` and fsync it (callers hold the file's lock)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- digests -----------------------------------------------------------------------------------------

def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: the bytes that are hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_hex(data: bytes) -> str:
    """sha256 of ``data`` as 64 hex chars."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 (64 hex chars) of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


# -- times -------------------------------------------------------------------------------------------

def utc_now() -> str:
    """The current UTC time as ISO 8601 text to the second (``2026-11-29T11:12:33+00:00``), for the
    informational times of records; never part of a key."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def age(iso: str | None, now: _dt.datetime | None = None) -> str:
    """``"2024-05-01T10:00:00+00:00"`` -> ``"3h"`` style age (s, m, h, d); ``"?"`` when unparsable."""
    try:
        t = _dt.datetime.fromisoformat(iso or "")
    except ValueError:
        return "?"
    s = ((now or _dt.datetime.now(_dt.timezone.utc)) - t).total_seconds()
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{int(s // n)}{unit}"
    return f"{max(0, int(s))}s"


def seconds_since(iso: str | None, now: _dt.datetime | None = None) -> float | None:
    """Seconds from the ISO 8601 time ``iso`` to ``now`` (default: the current UTC time), rounded to 0.001;
    None when ``iso`` is None or unparsable. JSON outputs give ages this way (``age_s``), never as text."""
    try:
        t = _dt.datetime.fromisoformat(iso or "")
    except ValueError:
        return None
    return round(((now or _dt.datetime.now(_dt.timezone.utc)) - t).total_seconds(), 3)


# -- statistics --------------------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float,
               method: Literal["linear", "nearest-rank"] = "linear") -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values`` (any order).

    Args:
        method: ``linear`` interpolates between order statistics (numpy's default; latency figures);
            ``nearest-rank`` is the smallest value with at least ``q`` % of the values at or below it
            (for 20 values or fewer, p95 is the maximum; the release gates' compile-time p95).

    Raises:
        ValueError: no values, or ``q`` outside [0, 100].
    """
    vs: Sequence[float] = sorted(values)
    if not vs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    if method == "nearest-rank":
        return vs[max(1, math.ceil(q / 100 * len(vs))) - 1]
    pos = (len(vs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(vs) - 1)
    return vs[lo] + (vs[hi] - vs[lo]) * (pos - lo)


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (inverse CDF) of ``p`` in (0, 1), by bisection on ``math.erf``."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def median_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of ``values`` and a distribution-free confidence interval for it, from order statistics.

    With ``n`` sorted values, the number below the true median is Binomial(n, 1/2); the interval is
    ``[x_(j), x_(k)]`` with ``j = floor(n/2 - z sqrt(n)/2)`` and ``k = ceil(n/2 + z sqrt(n)/2)`` (1-based,
    clamped to ``[1, n]``), ``z`` the normal quantile of ``(1 + confidence) / 2`` (the normal approximation
    of the binomial; for fewer than about 10 values the interval is the whole range). No assumption on
    the shape of the distribution, so a heavy right tail (a noisy host) widens the interval only as far
    as it moves the middle values.

    Returns:
        ``(median, low, high)`` in the values' unit.

    Raises:
        ValueError: no values, or ``confidence`` outside (0, 1).
    """
    vs = sorted(values)
    n = len(vs)
    if not n:
        raise ValueError("median of no values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    z = _normal_quantile((1 + confidence) / 2)
    j = max(1, math.floor(n / 2 - z * math.sqrt(n) / 2))
    k = min(n, math.ceil(n / 2 + z * math.sqrt(n) / 2) + 1)
    return percentile(vs, 50), vs[j - 1], vs[k - 1]


def ratio_ci(candidate: Iterable[float], baseline: Iterable[float],
             confidence: float = 0.95) -> tuple[float, float, float]:
    """The ratio of two medians, ``median(candidate) / median(baseline)``, with a conservative confidence
    interval: each median's order-statistic interval (:func:`median_ci`) at ``sqrt(confidence)``, so that
    both hold together with probability at least ``confidence`` (independent samples), combined as
    ``[cand_low / base_high, cand_high / base_low]``.

    Returns:
        ``(ratio, low, high)``.

    Raises:
        ValueError: no values on either side, a non-positive median bound, or a bad ``confidence``.
    """
    each = math.sqrt(confidence)
    c, c_lo, c_hi = median_ci(candidate, each)
    b, b_lo, b_hi = median_ci(baseline, each)
    if b_lo <= 0 or b <= 0:
        raise ValueError("the baseline's latencies must be positive")
    return c / b, c_lo / b_hi, c_hi / b_lo


def swap_in_folder(staging: Path, dest: Path) -> None:
    """Replace the folder ``dest`` by the fully written folder ``staging`` with renames (``dest`` may be
    absent). If the final rename fails, the old ``dest`` is put back; the old content is deleted after."""
    import shutil

    if not dest.exists():
        os.rename(staging, dest)
        return
    old = dest.parent / f".{dest.name}.old.{os.getpid()}.{secrets.token_hex(4)}"
    os.rename(dest, old)
    try:
        os.rename(staging, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an ``s`` unless ``n`` is 1: ``"1 target"``, ``"2 targets"``, ``"0 files"``."""
    return f"{n} {word}{'s' if n != 1 else ''}"


__all__ = ["DISK_FULL_ERRNOS", "age", "append_line", "canonical_json", "commit_temp", "file_sha256", "fsync_path",
           "is_disk_full", "json_bytes", "median_ci", "percentile", "plural", "ratio_ci", "read_json", "seconds_since",
           "sha256_hex", "swap_in_folder", "temp_name", "utc_now", "write_atomic", "write_json_atomic"]
