"""How a failed Neuron trace is told apart: a transient compiler failure (exit 70, retried), a compiler killed
by a signal (usually the out-of-memory killer), a compiler error with its first diagnostic, anything else.

Facts [seen]: ``torch_neuronx.trace`` raises ``RuntimeError("neuronx-cc failed with <status>")`` when the
compiler fails; status 70 is a transient tool failure; a negative status is the signal that killed it
[guess: subprocess convention]. The log is parsed by :mod:`neuron_build.compilers.neuron.neuronx_log`.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import CompileFailed
from neuron_build.compilers.neuron.neuronx_log import LogSummary, failure_reason, parse_log
from neuron_build.status import Status

#: ``RuntimeError("neuronx-cc failed with 1")`` [seen].
_FAILED_WITH = re.compile(r"neuronx-cc failed with (-?\d+)")
EXIT_TRANSIENT = 70      # [seen]
EXIT_KILLED = 137        # the worker's own status for a compiler killed by SIGKILL (128 + 9, shell style)


def log_digest(summary: LogSummary) -> dict[str, Any]:
    """What the manifest keeps of a parsed compiler log (times in seconds)."""
    d = summary.to_json()
    keep = ("status", "op_count", "compile_time_s", "instruction_count", "pass_times", "diagnostics",
            "internal_errors", "cache_events", "unparsed", "lines", "replaced_bytes")
    return {k: d[k] for k in keep}


def classify_failure(exc: BaseException, logs: list[Path], work: Path, *, has_neuron_device: bool,
                     tp_degree: int = 1, compiler_peak_rss_bytes: int | None = None) -> CompileFailed:
    """Turn an exception from ``trace`` into a :class:`CompileFailed` with a manifest status.

    ``logs`` are the candidate compiler logs (the last one that exists is read). Status 70 -> TRANSIENT
    (exit 70, so the build retries it); a negative status -> KILLED (exit 137; the build adds the peak
    memory); any other compiler status -> ERROR with ``"<CODE>: <first diagnostic line>"`` when the log
    has one; anything else -> ERROR with the exception's first line. Details carry the compiler status,
    the parsed log (diagnostics with code, message and line), the compiler's peak memory and the log's
    path relative to the work folder (``compiler_log``) so the build keeps it with the failure.
    ``compiler_peak_rss_bytes`` is what :class:`ChildPeakMonitor` saw (bytes), recorded as given.
    """
    text = str(exc)
    m = _FAILED_WITH.search(text)
    log_path = next((p for p in reversed(logs) if p.is_file()), None)
    summary = parse_log(log_path.read_bytes()) if log_path is not None else None
    details: dict[str, Any] = {"exception": f"{type(exc).__name__}: {first_line(exc)}",
                               "compiler_peak_rss_bytes": compiler_peak_rss_bytes}
    if summary is not None:
        details["log"] = log_digest(summary)
        details["diagnostics"] = [d.to_json() for d in summary.diagnostics]
        try:
            details["compiler_log"] = log_path.relative_to(work).as_posix()
        except ValueError:
            details["compiler_log"] = str(log_path)
    found = failure_reason(summary) if summary is not None else None
    if m is None:
        reason = f"{type(exc).__name__}: {first_line(exc)}"
        if not has_neuron_device and tp_degree > 1:
            reason += (" (this host has no Neuron device, /dev/neuron* not found; tensor-parallel tracing with "
                       "neuronx-distributed needs one)")
        return CompileFailed(Status.ERROR, reason[:500], 1, details)
    code = int(m.group(1))
    details["compiler_exit_code"] = code
    if code == EXIT_TRANSIENT:
        reason = "neuronx-cc exited with status 70 (a transient tool failure)" + (f": {found}" if found else "")
        return CompileFailed(Status.TRANSIENT, reason[:500], EXIT_TRANSIENT, details)
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        reason = f"neuronx-cc was killed by {sig}"
        if sig == "SIGKILL":
            reason += " (usually the kernel's out-of-memory killer)"
        return CompileFailed(Status.KILLED, reason, EXIT_KILLED if sig == "SIGKILL" else 128 - code, details)
    if found:
        reason = found
    else:
        last = _last_log_line(log_path)
        reason = f"neuronx-cc failed with status {code}" + (f": {last}" if last else " (no compiler log)")
    return CompileFailed(Status.ERROR, reason[:500], 1, details)


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""


def _last_line_of(data: bytes) -> str:
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _last_log_line(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return _last_line_of(path.read_bytes())
    except OSError:
        return ""


__all__ = ["EXIT_KILLED", "EXIT_TRANSIENT", "classify_failure", "first_line", "log_digest"]
