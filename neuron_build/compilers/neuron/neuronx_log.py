"""Parse the log of a neuronx-cc compile into a :class:`LogSummary`.

There is no single documented summary format for neuronx-cc logs, so this module recognises every
format listed in ``neuron-toolchain.md`` ("What its logs look like") and tolerates everything else.
Tags follow the toolchain notes: [doc] = stated in the Neuron SDK documentation, [seen] = seen in real
output pasted in public issues (one version only), [guess] = inferred; verify on a Neuron host.

Formats recognised (each is matched anywhere in a line, so a leading timestamp of any shape, progress
dots glued to the front, or a ``LEVEL pid [logger]:`` prefix do not matter):

- Status lines.  ``Compiler status PASS`` [seen]; ``Compiler status ERROR`` [guess for neuronx-cc,
  seen in old neuron-cc output]; ``Compiler status: SUCCESS`` / ``Compiler status: FAILED`` [guess:
  the project's own summary-line requirement, not a known neuronx-cc format].  Words
  PASS/PASSED/SUCCESS/SUCCEEDED/OK -> "PASS"; ERROR/ERRORS/FAIL/FAILED/FAILURE -> "ERROR" (the extra
  spellings are [guess]).  The last status line wins; an unknown word is noted in ``unparsed``.
- Summary lines [guess: the project's own requirement]: ``... NEFF op count: 41`` and
  ``... Compile time: 214.6 sec``.  The last one wins.  Compile time accepts s/sec/secs/second(s) or
  no unit, and converts ms and min/minute(s) [guess]; NaN, infinite or negative values are rejected.
- Instruction counts: ``Compiler generated too many instructions (6888787)`` [seen]; only the
  parenthesised number directly after "too many instructions ..." is taken (``Too many instructions
  after unroll for function sg0000 !`` carries no count and is ignored). The last one wins.
- Coded diagnostics, one per line [doc, seen]: old bracketed codes ``[XCG815]``, ``[NLA001]``,
  ``[TEN404]``, ``[F134]``, ``[XTP002]``, ``[LUR015]`` (1-5 capitals + 3-4 digits in brackets) and
  current ``NCC_EOOM001``-style codes (bare or bracketed).  The code is stored without brackets; the
  message is the rest of the line after the code.  Severity: ``NCC_E*`` error, ``NCC_W*`` warning,
  ``NCC_I*`` info [guess]; bracketed codes are errors unless a WARN/WARNING/INFO level word precedes
  the code on the line [guess].
- Internal errors [seen]: ``<timestamp> ERROR <pid> [neuronx-cc]: ...`` (also ``[neuron-cc]``, pid
  optional, CRITICAL/FATAL accepted [guess]).  Lines whose text is empty or only ``*``/``-``/``=``
  decoration are not kept but still count as an error signal.  Python tracebacks
  (``Traceback (most recent call last):`` then indented lines, the exception line, and chained
  "During handling ..." / "The above exception ..." blocks) are kept as kind "traceback", wherever they
  appear [seen].
- Per-pass timings [seen]: ``Running <pass>`` / ``<pass> finished after 0.163 seconds`` (newer
  neuronx-cc with ``--verbose info``), keyed by the pass name on the "finished" line (or, when that
  line has no name, by the last ``Running <pass>``).  Older releases print
  ``[sg00/Tensorizer/LoopFusion]: Exit time region: delta=2.437s`` after ``... Enter time region``
  [seen]; such a region is keyed by the last ``/`` component of its bracketed logger name
  (``LoopFusion``), else by the name of the innermost open ``Enter time region`` line, else
  ``region_<n>`` (n counts the unnamed regions from 1).  A pass that runs more than once (per
  subgraph, or nested names) has its times summed; sums are rounded to 6 decimals.  All in seconds.
- libneuronxla wrapper lines [doc, seen]: ``INFO ||NEURON_CC_WRAPPER||: Call compiler with cmd: ...``
  -> "compile_cmd" (detail = the command text as printed, usually a Python list repr);
  ``Using a cached neff at <path>`` -> "cache_hit"; ``Got a cached failed neff at <path>. Will skip
  compilation ...`` -> "cache_failed"; ``ERROR ||NEURON_CC_WRAPPER||: Compilation failed for <path>
  ...`` -> "compile_failed" [seen] (an error signal like an internal error).  Matched on the message
  text, whatever the ``||TAG||``.

Status rules: the last status line wins; without one, any error signal (an error-severity diagnostic,
an internal-error line, a traceback, a wrapper "compile_failed" line) gives "ERROR"; otherwise None.

``unparsed`` collects short notes about what could not be understood: the number of non-UTF-8 bytes
replaced (and the first line holding one), "log is empty", "log ends mid-line", summary lines whose
number did not parse, unknown status words, "finished after" lines without a pass name, lists that
were capped, and "no known compiler output" when nothing at all was recognised.  At most
``MAX_NOTES`` per-line notes are kept, followed by a "... and N more" note.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CacheEvent",
    "Diagnostic",
    "InternalError",
    "LogSummary",
    "failure_reason",
    "first_diagnostic_line",
    "parse_log",
]

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


# --------------------------------------------------------------------------------------------------
# Patterns. Each is guarded by a cheap substring test in the loop, so most lines cost a few `in`s.

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_SECONDS_RE = re.compile(r"\s*(" + _NUM + r")\s*([A-Za-z]*)")
_SECOND_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
                 "ms": 0.001, "msec": 0.001, "min": 60.0, "mins": 60.0, "minute": 60.0,
                 "minutes": 60.0}

# [seen] "Compiler status PASS"; [guess, project requirement] "Compiler status: SUCCESS".
_STATUS_RE = re.compile(r"Compiler status\b:?[ \t]*([A-Za-z_]*)")
_STATUS_WORDS = {
    "PASS": "PASS", "PASSED": "PASS", "SUCCESS": "PASS", "SUCCEEDED": "PASS", "OK": "PASS",
    "ERROR": "ERROR", "ERRORS": "ERROR", "FAIL": "ERROR", "FAILED": "ERROR", "FAILURE": "ERROR",
}
# [guess, project requirement] "NEFF op count: 41", "Compile time: 214.6 sec".
_OP_COUNT_RE = re.compile(r"NEFF op count\s*:\s*(\S*)")
_COMPILE_TIME_RE = re.compile(r"\bCompile time\s*:(.*)")
# [seen] "Compiler generated too many instructions (6888787)."
_INSTR_RE = re.compile(r"too many instructions\b[^(\n]{0,80}\(\s*(\d[\d,]*)\s*\)", re.IGNORECASE)
# [seen] "<pass> finished after 0.163 seconds", "Running <pass>" (found with str.find, not a regex:
# this is the most frequent line of a verbose log).
_FINISHED = "finished after"
_PASS_NAME_RE = re.compile(r"[A-Za-z_][\w.\-/]*")
_RUNNING = "Running "
# [seen] "[sg00/Tensorizer/LoopFusion]: Exit time region: delta=2.437s" / "...: Enter time region".
_EXIT_REGION = "Exit time region"
_ENTER_REGION = "Enter time region"
_DELTA_RE = re.compile(r"\s*:?\s*delta\s*=\s*(\S*)")
# [doc, seen] coded diagnostics.
_OLD_CODE_RE = re.compile(r"\[([A-Z]{1,5}\d{3,4})\]")
_NCC_CODE_RE = re.compile(r"\[?\b(NCC_[A-Z]{2,6}\d{2,4})\b\]?")
_LEVEL_WARN_RE = re.compile(r"\bWARN(?:ING)?\b")
_LEVEL_INFO_RE = re.compile(r"\bINFO\b")
# [seen] "<timestamp> ERROR <pid> [neuronx-cc]: ..." and old "ERROR [neuron-cc]: ...".
_INTERNAL_RE = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\s+(?:\d+\s+)?\[neuronx?-?cc\]\s*:[ \t]?(.*)")
_DECORATION_RE = re.compile(r"[\s*=\-]*")
_ERROR_MESSAGE_RE = re.compile(r"\s*Error message\s*:\s*(.*)")
_ERROR_HEADER_RE = re.compile(r"An Internal Compiler Error has occurred", re.IGNORECASE)
# [doc, seen] libneuronxla wrapper lines.
_CMD_RE = re.compile(r"Call compiler with cmd\s*:\s*(.*)")
_CACHE_HIT_RE = re.compile(r"Using a cached neff at\s+(.+?)\.?(?:\s+(?:Exiting|Skipping)\b.*)?\s*$")
_CACHE_FAILED_RE = re.compile(r"Got a cached failed neff at\s+(.+?)\.?(?:\s+Will skip\b.*)?\s*$")
_COMPILE_FAILED_RE = re.compile(r"\|\|\s*:\s*(Compilation failed\b.*)")
# Python tracebacks.
_TB_START = "Traceback (most recent call last)"
_TB_CHAIN_RE = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")

_SURROGATE_ESCAPES_RE = re.compile("[\udc80-\udcff]")


def _clip(text: str, keep_indent: bool = False) -> str:
    text = text.rstrip() if keep_indent else text.strip()
    if len(text) > MAX_MESSAGE:
        return text[:MAX_MESSAGE] + "..."
    return text


def _parse_seconds(rest: str) -> float | None:
    """Parse ``"0.163 seconds"``, ``"2.437s"``, ``"214.6 sec"`` into seconds; None if not a finite,
    non-negative time in a known unit."""
    m = _SECONDS_RE.match(rest)
    if not m:
        return None
    factor = _SECOND_UNITS.get(m.group(2).lower())
    if factor is None:
        return None
    try:
        value = float(m.group(1)) * factor
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _parse_int(text: str) -> int | None:
    text = text.strip().rstrip(".,;").replace(",", "").replace("_", "")
    if not text.isascii() or not text.isdigit() or len(text) > 30:
        return None
    return int(text)


def _short(text: str, limit: int = 60) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


def _decode(data: bytes | bytearray | memoryview) -> tuple[str, int, int | None]:
    """Decode UTF-8 with replacement; return (text, replaced byte count, line of the first bad byte)."""
    raw = bytes(data)
    text = raw.decode("utf-8", errors="replace")
    n_fffd = text.count("\ufffd")
    if not n_fffd:
        return text, 0, None
    genuine = raw.count(b"\xef\xbf\xbd")  # U+FFFD characters that were in the input as such
    if n_fffd == genuine:
        return text, 0, None
    # Valid bytes re-encode to themselves and each inserted U+FFFD to 3 bytes, so the bytes that
    # were replaced are the difference.
    count = len(raw) - (len(text.encode("utf-8")) - 3 * (n_fffd - genuine))
    if not genuine:
        first_index = text.find("\ufffd")
        first_line = text.count("\n", 0, first_index) + 1
    else:  # rare: locate the first bad byte exactly (surrogateescape gives one surrogate per byte)
        escaped = raw.decode("utf-8", errors="surrogateescape")
        m = _SURROGATE_ESCAPES_RE.search(escaped)
        first_line = escaped.count("\n", 0, m.start()) + 1 if m else None
    return text, count, first_line


class _Notes:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, note: str) -> None:
        if len(self.items) < MAX_NOTES:
            self.items.append(note)
        else:
            self.dropped += 1

    def result(self) -> list[str]:
        out = list(self.items)
        if self.dropped:
            out.append(f"... and {self.dropped} more notes")
        return out


def parse_log(data: bytes | bytearray | memoryview | str) -> LogSummary:
    """Parse the log of a neuronx-cc compile (bytes as written, or already-decoded text).

    Bytes are decoded as UTF-8 with ``errors="replace"``.  Never raises on any content: empty,
    truncated, binary or mixed-encoding logs give a summary with notes in ``unparsed``.  (Should a bug
    in this module raise, the error is caught and reported as an ``internal parser error`` note.)
    Raises ``TypeError`` only if ``data`` is neither ``str`` nor bytes-like.  Single pass over the
    lines; times are in seconds.
    """
    if isinstance(data, str):
        text, replaced, first_bad_line = data, 0, None
    elif isinstance(data, (bytes, bytearray, memoryview)):
        text, replaced, first_bad_line = _decode(data)
    else:
        raise TypeError(f"parse_log() needs bytes or str, not {type(data).__name__}")
    try:
        return _parse_text(text, replaced, first_bad_line)
    except Exception as exc:  # pragma: no cover - safety net, see docstring
        n = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
        return LogSummary(
            lines=n,
            replaced_bytes=replaced,
            unparsed=(f"internal parser error: {type(exc).__name__}: {_short(str(exc))}",),
        )


def _region_tag(line: str, end: int) -> str:
    """The last ``/`` component of a ``[logger/name]`` tag just before ``line[end:]``, or ""."""
    head = line[:end].rstrip(" \t:")
    if not head.endswith("]"):
        return ""
    tag = head[head.rfind("[") + 1 : -1]
    return tag.rsplit("/", 1)[-1].strip()


def _name_before(line: str, end: int) -> str | None:
    """The pass name written just before ``line[end:]`` ("finished after"), or None if there is none.
    Returns "" when the text before is not a word boundary (e.g. "unfinished after": not ours)."""
    head = line[:end]
    stripped = head.rstrip()
    if head and stripped == head and not head.endswith((":", "]")):
        return ""
    token = stripped.rsplit(None, 1)[-1] if stripped else ""
    token = token.rsplit(":", 1)[-1].rsplit("]", 1)[-1]
    return token if _PASS_NAME_RE.fullmatch(token) else None


def _parse_text(text: str, replaced: int, first_bad_line: int | None) -> LogSummary:
    notes = _Notes()
    head: list[str] = []  # whole-log notes, listed before per-line notes

    if not text.strip():
        head.append("log is empty" if not text else "log is empty (whitespace only)")
    if replaced:
        head.append(f"{replaced} non-UTF-8 byte(s) replaced with U+FFFD (first on line {first_bad_line})")

    raw_lines = text.split("\n")
    if raw_lines and raw_lines[-1] == "":
        raw_lines.pop()
    n_lines = len(raw_lines)
    if text and not text.endswith("\n"):
        head.append(f"log ends mid-line (no newline after line {n_lines})")

    # Each kind of line is looked for only if its key text occurs somewhere in the log: one fast
    # scan of the whole text each, which keeps the per-line cost low on huge verbose logs.
    want_cr = "\r" in text
    want_status = "Compiler status" in text
    want_ops = "op count" in text
    want_time = "Compile time" in text
    want_instr = "instructions" in text
    want_finished = _FINISHED in text
    want_running = want_finished and _RUNNING in text
    want_region = "time region" in text
    want_brackets = "[" in text
    want_ncc = "NCC_" in text
    want_internal = "cc]" in text
    want_cmd = "compiler with cmd" in text
    want_hit = "cached neff" in text
    want_failed = "cached failed neff" in text
    want_wrapper_fail = "Compilation failed" in text
    want_tb = _TB_START in text

    status: str | None = None
    op_count: int | None = None
    compile_time: float | None = None
    instr: int | None = None
    pass_times: dict[str, float] = {}
    diagnostics: list[Diagnostic] = []
    internal: list[InternalError] = []
    events: list[CacheEvent] = []
    command: str | None = None
    error_signal = False
    dropped = {"diagnostics": 0, "internal_errors": 0, "cache_events": 0}

    last_running: str | None = None
    region_stack: list[str] = []
    unnamed_regions = 0
    # Traceback state: 0 none, 1 inside (indented frame lines), 2 after the exception line,
    # 3 after a "During handling ..." line (waiting for the next Traceback).
    tb_state = 0

    def add_time(name: str, seconds: float) -> None:
        pass_times[name] = round(pass_times.get(name, 0.0) + seconds, 6)

    def keep(target: list, item: Any, kind: str) -> None:
        if len(target) < MAX_ITEMS:
            target.append(item)
        else:
            dropped[kind] += 1

    for lineno, line in enumerate(raw_lines, 1):
        if want_cr and line.endswith("\r"):
            line = line.rstrip("\r")

        # --- Python tracebacks (state machine) ---------------------------------------------------
        if tb_state:
            stripped = line.strip()
            if tb_state == 1:
                if not stripped:
                    pass
                elif line[:1] in (" ", "\t"):
                    keep(internal, InternalError("traceback", _clip(line, keep_indent=True), lineno), "internal_errors")
                    continue
                elif _TB_START in line or "[neuron" in line:
                    tb_state = 0  # a new traceback, or back to compiler error lines
                else:  # the exception line ends the traceback
                    keep(internal, InternalError("traceback", _clip(line, keep_indent=True), lineno), "internal_errors")
                    tb_state = 2
                    continue
            else:
                if not stripped:
                    continue
                if _TB_CHAIN_RE.match(stripped):
                    keep(internal, InternalError("traceback", _clip(stripped), lineno), "internal_errors")
                    tb_state = 3
                    continue
                tb_state = 0
        if want_tb and _TB_START in line and "[neuron" not in line:
            keep(internal, InternalError("traceback", _clip(line, keep_indent=True), lineno), "internal_errors")
            error_signal = True
            tb_state = 1
            continue

        # --- status and summary lines ------------------------------------------------------------
        if want_status and "Compiler status" in line:
            m = _STATUS_RE.search(line)
            if m:
                word = m.group(1)
                mapped = _STATUS_WORDS.get(word.upper())
                if mapped:
                    status = mapped
                elif word:
                    notes.add(f"line {lineno}: unknown compiler status {_short(word)!r}")
                else:
                    notes.add(f"line {lineno}: compiler status line without a status word")
        if want_ops and "op count" in line:
            m = _OP_COUNT_RE.search(line)
            if m:
                value = _parse_int(m.group(1))
                if value is None:
                    notes.add(f"line {lineno}: NEFF op count {_short(m.group(1))!r} is not an integer")
                else:
                    op_count = value
        if want_time and "Compile time" in line:
            m = _COMPILE_TIME_RE.search(line)
            if m:
                seconds = _parse_seconds(m.group(1))
                if seconds is None:
                    notes.add(f"line {lineno}: compile time {_short(m.group(1))!r} is not a time")
                else:
                    compile_time = seconds
        if want_instr and "instructions" in line:
            m = _INSTR_RE.search(line)
            if m:
                value = _parse_int(m.group(1))
                if value is not None:
                    instr = value

        # --- pass timings ------------------------------------------------------------------------
        if want_finished and _FINISHED in line:
            idx = line.find(_FINISHED)
            written = _name_before(line, idx)
            if written != "":
                name = written or last_running
                rest = line[idx + len(_FINISHED):]
                seconds = _parse_seconds(rest)
                if seconds is None:
                    notes.add(f"line {lineno}: pass time {_short(rest)!r} is not a time")
                elif not name:
                    notes.add(f"line {lineno}: 'finished after' line without a pass name")
                else:
                    add_time(name, seconds)
                if written is None or written == last_running:
                    last_running = None
        elif want_running and _RUNNING in line:
            idx = line.rfind(_RUNNING)
            if idx == 0 or not line[idx - 1].isalnum():
                name = line[idx + len(_RUNNING):].strip()
                if _PASS_NAME_RE.fullmatch(name):
                    last_running = name
        if want_region and "time region" in line:
            idx = line.find(_EXIT_REGION)
            if idx >= 0:
                m = _DELTA_RE.match(line, idx + len(_EXIT_REGION))
                if m:
                    name = _region_tag(line, idx)
                    enter_name = region_stack.pop() if region_stack else ""
                    if not name:
                        name = enter_name
                    if not name:
                        unnamed_regions += 1
                        name = f"region_{unnamed_regions}"
                    seconds = _parse_seconds(m.group(1))
                    if seconds is None:
                        notes.add(f"line {lineno}: region time {_short(m.group(1))!r} is not a time")
                    else:
                        add_time(name, seconds)
            else:
                idx = line.find(_ENTER_REGION)
                if idx >= 0:
                    region_stack.append(_region_tag(line, idx))
                    if len(region_stack) > 1000:  # unbalanced log: don't grow without bound
                        del region_stack[0]

        # --- coded diagnostics -------------------------------------------------------------------
        has_bracket = want_brackets and "[" in line
        has_ncc = want_ncc and "NCC_" in line
        if has_bracket or has_ncc:
            m = _OLD_CODE_RE.search(line) if has_bracket else None
            if has_ncc:
                m2 = _NCC_CODE_RE.search(line)
                if m2 and (m is None or m2.start() < m.start()):
                    m = m2
            if m:
                code = m.group(1)
                message = line[m.end():].lstrip(" \t:-]")
                if code.startswith("NCC_"):
                    severity = {"W": "warning", "I": "info"}.get(code[4:5], "error")
                else:
                    prefix = line[: m.start()]
                    if _LEVEL_WARN_RE.search(prefix):
                        severity = "warning"
                    elif _LEVEL_INFO_RE.search(prefix):
                        severity = "info"
                    else:
                        severity = "error"
                if severity == "error":
                    error_signal = True
                keep(diagnostics, Diagnostic(code, _clip(message), lineno, severity), "diagnostics")
            # --- internal errors -----------------------------------------------------------------
            if want_internal and has_bracket and "cc]" in line:
                m = _INTERNAL_RE.search(line)
                if m:
                    error_signal = True
                    body = m.group(1).rstrip()
                    if not _DECORATION_RE.fullmatch(body):
                        keep(internal, InternalError("error", _clip(body), lineno), "internal_errors")

        # --- wrapper lines -----------------------------------------------------------------------
        if want_cmd and "compiler with cmd" in line:
            m = _CMD_RE.search(line)
            if m:
                command = _clip(m.group(1))
                keep(events, CacheEvent("compile_cmd", command, lineno), "cache_events")
        elif want_hit and "cached neff" in line:
            m = _CACHE_HIT_RE.search(line)
            if m:
                keep(events, CacheEvent("cache_hit", _clip(m.group(1)), lineno), "cache_events")
        elif want_failed and "cached failed neff" in line:
            m = _CACHE_FAILED_RE.search(line)
            if m:
                keep(events, CacheEvent("cache_failed", _clip(m.group(1)), lineno), "cache_events")
        elif want_wrapper_fail and "Compilation failed" in line:
            m = _COMPILE_FAILED_RE.search(line)
            if m:
                error_signal = True
                keep(events, CacheEvent("compile_failed", _clip(m.group(1)), lineno), "cache_events")

    if status is None and error_signal:
        status = "ERROR"

    for kind, count in dropped.items():
        if count:
            head.append(f"{count} more {kind} entries not kept (limit {MAX_ITEMS})")
    recognised = (status is not None or op_count is not None or compile_time is not None
                  or instr is not None or pass_times or diagnostics or internal or events
                  or notes.items)
    if text.strip() and not recognised:
        head.append(f"no known compiler output found in {n_lines} line(s)")

    return LogSummary(
        status=status,
        op_count=op_count,
        compile_time_s=compile_time,
        instruction_count=instr,
        pass_times=pass_times,
        diagnostics=tuple(diagnostics),
        internal_errors=tuple(internal),
        cache_events=tuple(events),
        compiler_command=command,
        unparsed=tuple(head + notes.result()),
        lines=n_lines,
        replaced_bytes=replaced,
    )
