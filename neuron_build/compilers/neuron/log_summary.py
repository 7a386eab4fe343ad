"""What the neuronx-cc log parser (:mod:`.neuronx_log`) returns: a :class:`LogSummary` of coded diagnostics,
internal errors, compile-cache events, status, op count and compile time, and the one-line failure reason read
from it. The formats recognised, each tagged [doc], [seen] or [guess], are listed in :mod:`.neuronx_log`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_ERROR_MESSAGE_RE = re.compile(r"\s*Error message\s*:\s*(.*)")
_ERROR_HEADER_RE = re.compile(r"An Internal Compiler Error has occurred", re.IGNORECASE)

#: Longest message text kept for one diagnostic / internal-error line (characters).
MAX_MESSAGE = 2000
#: Most entries kept in each of diagnostics, internal_errors and cache_events.
MAX_ITEMS = 1000
#: Most per-line notes kept in ``unparsed``.
MAX_NOTES = 20


@dataclass(frozen=True)
class Diagnostic:
    """One coded compiler diagnostic.

    ``code`` is without brackets (``XCG815``, ``NCC_EOOM001``); ``line`` is 1-based;
    ``severity`` is "error", "warning" or "info".
    """

    code: str
    message: str
    line: int
    severity: str = "error"

    def to_json(self) -> dict[str, Any]:
        """Return ``{code, message, line, severity}``."""
        return {"code": self.code, "message": self.message, "line": self.line, "severity": self.severity}


@dataclass(frozen=True)
class InternalError:
    """One kept internal-error or traceback line.

    ``kind`` is "error" for a ``ERROR <pid> [neuronx-cc]: text`` line (``text`` is what follows the
    colon) or "traceback" for a Python traceback line (``text`` is the whole line, right-stripped).
    ``line`` is 1-based.
    """

    kind: str
    text: str
    line: int

    def to_json(self) -> dict[str, Any]:
        """Return ``{kind, text, line}``."""
        return {"kind": self.kind, "text": self.text, "line": self.line}


@dataclass(frozen=True)
class CacheEvent:
    """One libneuronxla wrapper line.

    ``kind`` is "compile_cmd" (detail: the command text), "cache_hit" / "cache_failed" (detail: the
    cached NEFF path) or "compile_failed" (detail: the rest of the message). ``line`` is 1-based.
    """

    kind: str
    detail: str
    line: int

    def to_json(self) -> dict[str, Any]:
        """Return ``{kind, detail, line}``."""
        return {"kind": self.kind, "detail": self.detail, "line": self.line}


@dataclass(frozen=True)
class LogSummary:
    """What a neuronx-cc log says. Every field is None/empty when the log says nothing about it.

    - ``status``: "PASS", "ERROR" or None.
    - ``op_count``: from ``NEFF op count: N``.
    - ``compile_time_s``: from ``Compile time: S sec``, in seconds.
    - ``instruction_count``: from ``too many instructions (N)``.
    - ``pass_times``: pass or region name -> seconds (summed over repeats, in order of first
      appearance).
    - ``diagnostics``, ``internal_errors``, ``cache_events``: in log order, with 1-based line numbers.
    - ``compiler_command``: the last wrapper ``Call compiler with cmd:`` text.
    - ``unparsed``: short notes on what could not be understood (see the module docstring).
    - ``lines``: number of lines (a last line without a newline counts; an empty log has 0).
    - ``replaced_bytes``: number of non-UTF-8 bytes replaced by U+FFFD while decoding.
    """

    status: str | None = None
    op_count: int | None = None
    compile_time_s: float | None = None
    instruction_count: int | None = None
    pass_times: dict[str, float] = field(default_factory=dict)
    diagnostics: tuple[Diagnostic, ...] = ()
    internal_errors: tuple[InternalError, ...] = ()
    cache_events: tuple[CacheEvent, ...] = ()
    compiler_command: str | None = None
    unparsed: tuple[str, ...] = ()
    lines: int = 0
    replaced_bytes: int = 0

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        """The diagnostics of severity "error"."""
        return tuple(d for d in self.diagnostics if d.severity == "error")

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict of every field (floats are finite; times in seconds)."""
        return {
            "status": self.status,
            "op_count": self.op_count,
            "compile_time_s": self.compile_time_s,
            "instruction_count": self.instruction_count,
            "pass_times": dict(self.pass_times),
            "diagnostics": [d.to_json() for d in self.diagnostics],
            "internal_errors": [e.to_json() for e in self.internal_errors],
            "cache_events": [c.to_json() for c in self.cache_events],
            "compiler_command": self.compiler_command,
            "unparsed": list(self.unparsed),
            "lines": self.lines,
            "replaced_bytes": self.replaced_bytes,
        }


def first_diagnostic_line(summary: LogSummary) -> str | None:
    """Return ``"CODE: message"`` for the first error-severity diagnostic, or None if there is none."""
    for d in summary.diagnostics:
        if d.severity == "error":
            return f"{d.code}: {d.message}" if d.message else d.code
    return None


def failure_reason(summary: LogSummary) -> str | None:
    """Return a one-line failure reason: the first error diagnostic (``"CODE: message"``), else the
    first internal-error ``Error message:`` text, else the first other internal-error line, else the
    last traceback line (the exception), else a wrapper "Compilation failed" line, else None.
    Never raises."""
    reason = first_diagnostic_line(summary)
    if reason:
        return reason
    errors = [e for e in summary.internal_errors if e.kind == "error"]
    for e in errors:
        m = _ERROR_MESSAGE_RE.match(e.text)
        if m and m.group(1).strip():
            return m.group(1).strip()
    for e in errors:
        text = e.text.strip()
        if text and not _ERROR_HEADER_RE.match(text):
            return text
    tracebacks = [e for e in summary.internal_errors if e.kind == "traceback"]
    if tracebacks:
        return tracebacks[-1].text.strip()
    for c in summary.cache_events:
        if c.kind == "compile_failed":
            return c.detail
    return None


__all__ = ["MAX_ITEMS", "MAX_MESSAGE", "MAX_NOTES", "CacheEvent", "Diagnostic", "InternalError", "LogSummary",
           "failure_reason", "first_diagnostic_line"]
