"""One compile attempt: what a :class:`~neuron_build.build.executor.CompileRun` means, and the one place where
a full disk becomes a failure of the target.

:func:`classify` is pure (no processes, no files): it maps what the worker reported onto a
:class:`~neuron_build.status.Status` and the one-line reason the CLI prints. :func:`disk_full` turns an
``ENOSPC`` at a named stage into :class:`DiskFull`, whose message is the reason recorded for the target.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.build.executor import CompileRun
from neuron_build.compilers.base import STAGE_PREFIX
from neuron_build.errors import NeuronBuildError
from neuron_build.status import BuildResult, Status
from neuron_build.util import is_disk_full

if TYPE_CHECKING:
    from neuron_build.project.keys import KeyInfo
    from neuron_build.project.matrix import Target

TRANSIENT_EXIT = 70  # [seen] neuronx-cc exits 70 on transient tool failures
#: Below this many free bytes, the file system of a failed compile counts as full.
LOW_DISK_BYTES = 2**20


@dataclass(frozen=True)
class BuildContext:
    """One target being built: the target, its key, the attempt's number (1 for the first compile, 0
    before any), the logger bound to the target, the key components changed since its last build, and
    (while a failed attempt is recorded) the attempt's work folder. ``stale``: why the artifact the store
    holds for the key is stale (recorded inputs that changed): this build's manifest replaces it."""

    target: Target
    ki: KeyInfo
    log: Any
    attempt: int = 0
    changed: tuple[str, ...] = field(default_factory=tuple)
    work: Path | None = None
    stale: tuple[str, ...] = field(default_factory=tuple)



@dataclass
class Outcome:
    """The result of building one target.

    ``status`` is :attr:`BuildResult.CACHED` (``cached``: nothing compiled; ``reason`` starts with ``reused:``
    when another builder compiled it while this one waited for the key's lock) or the compile's
    :class:`~neuron_build.status.Status` (``PASS``, ``ERROR``, ``KILLED``, ``TIMEOUT``, ``TRANSIENT``,
    ``TOOLCHAIN_MISSING``); ``reason`` is one line for the CLI. A target skipped by ``retry_failed=False``
    keeps its recorded failure status, with ``compiled`` False and a reason starting ``not retried``.
    ``metrics`` are the compile's (``compile_time_s`` in seconds, ``peak_rss_bytes`` in bytes, ...).
    ``rechecked``: why the store's artifact of this key was checked again instead of served (its recorded
    inputs that changed, e.g. ``package pillow 10.0 -> 11.0``); empty when it was not.
    """

    target: str
    key: str
    status: Status | BuildResult
    reason: str = ""
    compiled: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    rechecked: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the store holds the target's artifact (cached or just built)."""
        return self.status in (BuildResult.CACHED, Status.PASS)


@dataclass(frozen=True)
class Classification:
    """The status of one compile attempt and its one-line reason (empty for PASS)."""

    status: Status
    reason: str = ""


def as_status(value: Any) -> Status:
    """``value`` (a status string from a worker or a record) as a :class:`Status`; a string that is none of
    them is kept as it is (str enums compare equal to their strings, so records stay identical)."""
    try:
        return Status(value)
    except ValueError:
        return value


def classify(run: CompileRun, timeout_s: float, free_bytes: int | None = None, folder: str | Path = "") -> Classification:
    """What a worker's run means, by today's rules, first match wins:

    0. the executor stopped it over its memory bound (``out_of_memory``): KILLED, "out of memory: ..."
       with the peak and the bound (MiB and bytes, :func:`out_of_memory_reason`);
    1. the executor stopped it: TIMEOUT, "stopped after <timeout_s> s (timeout_s under [build])";
    2. exit 0 with a ``result.json``: PASS;
    3. killed by a signal: KILLED, "killed by SIG..." (+ the OOM-killer note for SIGKILL) and the peak memory;
    4. the worker's ``error.json`` status and reason (for KILLED with the peak memory, and the compiler's);
    5. exit status 70: TRANSIENT;
    6. otherwise ERROR, "worker exited with status N: <last log line>".

    A failure other than TIMEOUT becomes ERROR "no space left on device in <folder> ... while compiling;
    free space and build again (<reason>)" when the worker log says the disk was full, or ``free_bytes``
    is below 1 MiB (torch aborts with SIGABRT when a save hits a full disk).

    Args:
        run: what the worker reported.
        timeout_s: the configured timeout (``[build] timeout_s``), seconds, for the TIMEOUT reason.
        free_bytes: free bytes on the file system of the artifact's folder, None when unknown.
        folder: the attempt's staging folder, named in the disk-full reason.
    """
    error = run.error or {}
    if run.out_of_memory and run.memory_limit_bytes:
        status, reason = Status.KILLED, out_of_memory_reason(run.peak_rss_bytes, run.memory_limit_bytes,
                                                             run.memory_limit_of)
    elif run.timed_out:
        status, reason = Status.TIMEOUT, f"stopped after {timeout_s:g} s (timeout_s under [build])"
    elif run.exit_code == 0 and run.result is not None:
        status, reason = Status.PASS, ""
    elif run.exit_code is not None and run.exit_code < 0:
        sig = signal.Signals(-run.exit_code).name
        status = Status.KILLED
        reason = (f"killed by {sig}" + (" (usually the kernel's out-of-memory killer)" if sig == "SIGKILL" else "")
                  + f"; peak memory {run.peak_rss_bytes / 2**30:.2f} GiB")
    elif error.get("status"):
        status, reason = as_status(error["status"]), error.get("reason", "")
        if status == Status.KILLED:  # the compiler (a grandchild) was killed; the worker reported it
            reason += f"; peak memory {run.peak_rss_bytes / 2**30:.2f} GiB"
            cc_peak = (error.get("details") or {}).get("compiler_peak_rss_bytes")
            if cc_peak:
                reason += f" (neuronx-cc {cc_peak / 2**30:.2f} GiB)"
    elif run.exit_code == TRANSIENT_EXIT:
        status, reason = Status.TRANSIENT, "exit status 70: transient tool failure"
    else:
        status, reason = Status.ERROR, f"worker exited with status {run.exit_code}: {last_line(run.log)}"
    if status not in (Status.PASS, Status.TIMEOUT):
        full = disk_full_note(run.log, free_bytes, folder)
        if full:
            status, reason = Status.ERROR, f"{full} while compiling; free space and build again ({reason})"
    return Classification(status, reason)


#: The words every out-of-memory reason starts with (the Dask client looks for them in failure records).
OUT_OF_MEMORY = "out of memory"


def out_of_memory_reason(peak: int, limit: int, limit_of: str) -> str:
    """The reason of a compile stopped over its memory bound: both figures, in MiB and bytes."""
    return (f"{OUT_OF_MEMORY}: the compile's process tree reached {peak / 2**20:.0f} MiB ({peak} bytes), above "
            f"{limit_of} of {limit / 2**20:.0f} MiB ({limit} bytes); stopped, and not retried on a worker of "
            f"this size: give it a worker with more memory (dask worker --memory-limit, --resources memory_gb=N)")


def disk_full_note(log: bytes, free_bytes: int | None, folder: str | Path) -> str | None:
    """"no space left on device in <folder> (<n> bytes free)" when a failed compile ran out of disk: its
    log says so, or fewer than 1 MiB are free. None otherwise."""
    said = b"No space left on device" in log or b"ENOSPC" in log
    if said or (free_bytes is not None and free_bytes < LOW_DISK_BYTES):
        return f"no space left on device in {folder}" + (f" ({free_bytes} bytes free)" if free_bytes is not None else "")
    return None


def free_space(path: Path) -> int | None:
    """Free bytes (for unprivileged users) on the file system holding ``path``; None when it cannot be told."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def last_line(log: bytes) -> str:
    """The last non-blank line of a log (at most 300 characters; the worker's stage lines skipped), or
    ``(empty log)``."""
    lines = [ln for ln in log.decode("utf-8", "replace").splitlines()
             if ln.strip() and not ln.startswith(STAGE_PREFIX)]
    return lines[-1].strip()[:300] if lines else "(empty log)"


def failure_log(run: CompileRun) -> bytes:
    """The log stored with a failure record: the worker's log, then the compiler's own log (when the worker
    named one) under a ``===== compiler log (<name>) =====`` header."""
    if run.compiler_log is None:
        return run.log
    rel = ((run.error or {}).get("details") or {}).get("compiler_log")
    return run.log + f"\n===== compiler log ({rel}) =====\n".encode() + run.compiler_log


class DiskFull(NeuronBuildError):
    """The file system filled up at a named stage of a build; the message is the target's failure reason,
    ``no space left on device while <stage> (<where>); free space and build again``. ``__cause__`` is the
    ``OSError``."""

    def __init__(self, stage: str, where: Any):
        super().__init__(f"no space left on device while {stage} ({where}); free space and build again")
        self.stage, self.where = stage, where


@contextmanager
def disk_full(stage: str, where: Any | Callable[[], Any], prefer_filename: bool = True) -> Iterator[None]:
    """Turn an ``OSError`` that says the disk is full (``ENOSPC``, ``EDQUOT``) in the block into
    :class:`DiskFull` for ``stage``; other errors pass unchanged.

    Args:
        stage: what was being done, e.g. ``"publishing"``.
        where: the path to name (or a callable returning it, evaluated when the disk fills up).
        prefer_filename: name the failing file (the error's ``filename``) instead of ``where`` when known.

    Raises:
        DiskFull: the disk filled up in the block.
    """
    try:
        yield
    except OSError as e:
        if not is_disk_full(e):
            raise
        named = e.filename if prefer_filename else None
        raise DiskFull(stage, named or (where() if callable(where) else where)) from e


__all__ = [
    "BuildContext",
    "OUT_OF_MEMORY",
    "TRANSIENT_EXIT",
    "Classification",
    "DiskFull",
    "Outcome",
    "as_status",
    "out_of_memory_reason",
    "classify",
    "disk_full",
    "disk_full_note",
    "failure_log",
    "free_space",
    "last_line",
]
