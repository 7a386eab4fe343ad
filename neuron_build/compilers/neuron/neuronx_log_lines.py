"""The per-kind line recognisers of the neuronx-cc log parser (:mod:`.neuronx_log`), and the accumulator they fill.

:mod:`.neuronx_log` decodes a log, splits it into lines and feeds each line to :func:`traceback_line` and to the
recognisers in :data:`RECOGNISERS`; this module holds the patterns, one small recogniser per kind of line and the
:class:`Accumulator` that turns what they found into a :class:`LogSummary`.  The formats, each tagged [doc], [seen]
or [guess], are listed in :mod:`.neuronx_log`'s docstring.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from neuron_build.compilers.neuron.log_summary import (
    MAX_ITEMS,
    MAX_MESSAGE,
    MAX_NOTES,
    CacheEvent,
    Diagnostic,
    InternalError,
    LogSummary,
)

__all__ = ["RECOGNISERS", "TB_START", "Accumulator", "short", "traceback_line"]

# --------------------------------------------------------------------------------------------------
# Patterns. Each is guarded by a cheap substring test in its recogniser, so most lines cost a few `in`s.

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
# [doc, seen] libneuronxla wrapper lines.
_CMD_RE = re.compile(r"Call compiler with cmd\s*:\s*(.*)")
_CACHE_HIT_RE = re.compile(r"Using a cached neff at\s+(.+?)\.?(?:\s+(?:Exiting|Skipping)\b.*)?\s*$")
_CACHE_FAILED_RE = re.compile(r"Got a cached failed neff at\s+(.+?)\.?(?:\s+Will skip\b.*)?\s*$")
_COMPILE_FAILED_RE = re.compile(r"\|\|\s*:\s*(Compilation failed\b.*)")
# Python tracebacks.
TB_START = "Traceback (most recent call last)"
_TB_CHAIN_RE = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")



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


def short(text: str, limit: int = 60) -> str:
    """``text`` stripped, cut to ``limit`` characters with "..." after (for notes)."""
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------------
# The parser: an accumulator, a traceback state machine, one recogniser per kind of line, one loop.
#
# neuronx_log._parse_text() feeds each line first to the traceback state machine, which may claim it (a claimed
# line is looked at by nothing else), and then to every recogniser in RECOGNISERS, in table order.
# Recognisers are independent of each other: several may find something on the same line (an
# ``ERROR [neuronx-cc]: [NCC_EVRF007] ... too many instructions (N)`` line is an internal error, a
# diagnostic and an instruction count).  Each one tests a cheap substring before any regex, so most
# lines cost a few `in`s; and a recogniser none of whose key texts occurs anywhere in the log is left
# out for the whole log (one fast scan of the text each), which keeps huge verbose logs fast.

#: Most open ``Enter time region`` names remembered (an unbalanced log must not grow without bound).
_MAX_OPEN_REGIONS = 1000


class _Capped:
    """The first ``limit`` items added, in order, and the number dropped after that."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[Any] = []
        self.dropped = 0

    def add(self, item: Any) -> None:
        if len(self.items) < self.limit:
            self.items.append(item)
        else:
            self.dropped += 1


class _Traceback(enum.Enum):
    """Where the current line stands relative to a Python traceback (see :func:`traceback_line`)."""

    #: Not in a traceback; a ``Traceback (most recent call last):`` line starts one.
    OUTSIDE = "outside"
    #: After the ``Traceback`` line: indented frame lines (blank lines allowed) until the exception line.
    FRAMES = "frames"
    #: After the exception line: blank lines are skipped, a chain line may follow.
    AFTER_EXCEPTION = "after exception"
    #: After a "During handling ..." / "The above exception ..." line: blank lines are skipped until
    #: the next ``Traceback`` line.  Read exactly like AFTER_EXCEPTION.
    AFTER_CHAIN = "after chain"


@dataclass
class Accumulator:
    """What the recognisers have found so far, and the state they carry from one line to the next."""

    status: str | None = None
    op_count: int | None = None
    compile_time_s: float | None = None
    instruction_count: int | None = None
    pass_times: dict[str, float] = field(default_factory=dict)
    diagnostics: _Capped = field(default_factory=lambda: _Capped(MAX_ITEMS))
    internal_errors: _Capped = field(default_factory=lambda: _Capped(MAX_ITEMS))
    cache_events: _Capped = field(default_factory=lambda: _Capped(MAX_ITEMS))
    compiler_command: str | None = None
    notes: _Capped = field(default_factory=lambda: _Capped(MAX_NOTES))
    #: Seen an error diagnostic, an internal-error line, a traceback or a wrapper "Compilation failed".
    error_signal: bool = False
    # State carried between lines.
    traceback: _Traceback = _Traceback.OUTSIDE
    last_running: str | None = None  # the pass of the last ``Running <pass>`` line not yet finished
    open_regions: list[str] = field(default_factory=list)  # tags of the open ``Enter time region`` lines
    unnamed_regions: int = 0

    def note(self, lineno: int, text: str) -> None:
        """Note something on line ``lineno`` that could not be understood."""
        self.notes.add(f"line {lineno}: {text}")

    def add_time(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to pass ``name`` (repeats are summed, rounded to 6 decimals)."""
        self.pass_times[name] = round(self.pass_times.get(name, 0.0) + seconds, 6)

    def keep_traceback(self, text: str, lineno: int) -> None:
        """Keep one traceback line."""
        self.internal_errors.add(InternalError("traceback", text, lineno))

    def summary(self, head: list[str], lines: int, replaced: int, text: str) -> LogSummary:
        """The :class:`LogSummary` of the whole log; ``head`` holds the whole-log notes found so far."""
        status = self.status
        if status is None and self.error_signal:
            status = "ERROR"
        head = list(head)
        for kind, capped in (("diagnostics", self.diagnostics), ("internal_errors", self.internal_errors),
                             ("cache_events", self.cache_events)):
            if capped.dropped:
                head.append(f"{capped.dropped} more {kind} entries not kept (limit {MAX_ITEMS})")
        recognised = (status is not None or self.op_count is not None or self.compile_time_s is not None
                      or self.instruction_count is not None or self.pass_times or self.diagnostics.items
                      or self.internal_errors.items or self.cache_events.items or self.notes.items)
        if text.strip() and not recognised:
            head.append(f"no known compiler output found in {lines} line(s)")
        notes = list(self.notes.items)
        if self.notes.dropped:
            notes.append(f"... and {self.notes.dropped} more notes")
        return LogSummary(
            status=status,
            op_count=self.op_count,
            compile_time_s=self.compile_time_s,
            instruction_count=self.instruction_count,
            pass_times=self.pass_times,
            diagnostics=tuple(self.diagnostics.items),
            internal_errors=tuple(self.internal_errors.items),
            cache_events=tuple(self.cache_events.items),
            compiler_command=self.compiler_command,
            unparsed=tuple(head + notes),
            lines=lines,
            replaced_bytes=replaced,
        )

# --- the traceback state machine ------------------------------------------------------------------


def traceback_line(acc: Accumulator, line: str, lineno: int) -> bool:
    """Feed one line to the traceback state machine; True if the line belongs to a traceback (then no
    recogniser looks at it).  Traceback lines are kept as kind "traceback" [seen]."""
    state = acc.traceback
    if state is _Traceback.FRAMES:
        if not line.strip():
            pass  # a blank line between frames: the traceback goes on
        elif line[:1] in (" ", "\t"):  # a frame line
            acc.keep_traceback(_clip(line, keep_indent=True), lineno)
            return True
        elif TB_START in line or "[neuron" in line:
            acc.traceback = _Traceback.OUTSIDE  # a new traceback, or back to compiler error lines
        else:  # the exception line ends the frames
            acc.keep_traceback(_clip(line, keep_indent=True), lineno)
            acc.traceback = _Traceback.AFTER_EXCEPTION
            return True
    elif state is not _Traceback.OUTSIDE:  # AFTER_EXCEPTION or AFTER_CHAIN
        stripped = line.strip()
        if not stripped:
            return True
        if _TB_CHAIN_RE.match(stripped):
            acc.keep_traceback(_clip(stripped), lineno)
            acc.traceback = _Traceback.AFTER_CHAIN
            return True
        acc.traceback = _Traceback.OUTSIDE
    if TB_START in line and "[neuron" not in line:
        acc.keep_traceback(_clip(line, keep_indent=True), lineno)
        acc.error_signal = True
        acc.traceback = _Traceback.FRAMES
        return True
    return False


# --- recognisers: one per kind of line, each ``(acc, line, lineno) -> None`` ----------------------


def _status_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``Compiler status PASS`` [seen] / ``Compiler status: FAILED`` [guess]: the last one wins."""
    if "Compiler status" not in line:
        return
    m = _STATUS_RE.search(line)
    if not m:
        return
    word = m.group(1)
    mapped = _STATUS_WORDS.get(word.upper())
    if mapped:
        acc.status = mapped
    elif word:
        acc.note(lineno, f"unknown compiler status {short(word)!r}")
    else:
        acc.note(lineno, "compiler status line without a status word")


def _op_count_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``NEFF op count: 41`` [guess: project requirement]: the last one wins."""
    if "op count" not in line:
        return
    m = _OP_COUNT_RE.search(line)
    if not m:
        return
    value = _parse_int(m.group(1))
    if value is None:
        acc.note(lineno, f"NEFF op count {short(m.group(1))!r} is not an integer")
    else:
        acc.op_count = value


def _compile_time_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``Compile time: 214.6 sec`` [guess: project requirement], in seconds: the last one wins."""
    if "Compile time" not in line:
        return
    m = _COMPILE_TIME_RE.search(line)
    if not m:
        return
    seconds = _parse_seconds(m.group(1))
    if seconds is None:
        acc.note(lineno, f"compile time {short(m.group(1))!r} is not a time")
    else:
        acc.compile_time_s = seconds


def _instruction_count_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``Compiler generated too many instructions (6888787)`` [seen]: the last one wins."""
    if "instructions" not in line:
        return
    m = _INSTR_RE.search(line)
    if m:
        value = _parse_int(m.group(1))
        if value is not None:
            acc.instruction_count = value


def _pass_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``<pass> finished after 0.163 seconds``, else ``Running <pass>`` [seen]."""
    idx = line.find(_FINISHED)
    if idx >= 0:
        _pass_finished(acc, line, lineno, idx)
    elif _RUNNING in line:
        _pass_running(acc, line)


def _pass_finished(acc: Accumulator, line: str, lineno: int, idx: int) -> None:
    """A "finished after" line (at ``idx``): add its time to the pass named before it, or else to the
    last ``Running <pass>``."""
    written = _name_before(line, idx)
    if written == "":
        return  # e.g. "unfinished after": not a pass line
    name = written or acc.last_running
    rest = line[idx + len(_FINISHED):]
    seconds = _parse_seconds(rest)
    if seconds is None:
        acc.note(lineno, f"pass time {short(rest)!r} is not a time")
    elif not name:
        acc.note(lineno, "'finished after' line without a pass name")
    else:
        acc.add_time(name, seconds)
    if written is None or written == acc.last_running:
        acc.last_running = None


def _pass_running(acc: Accumulator, line: str) -> None:
    """A ``Running <pass>`` line: remember the pass for an unnamed "finished after" line."""
    idx = line.rfind(_RUNNING)
    if idx == 0 or not line[idx - 1].isalnum():
        name = line[idx + len(_RUNNING):].strip()
        if _PASS_NAME_RE.fullmatch(name):
            acc.last_running = name


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


def _time_region_line(acc: Accumulator, line: str, lineno: int) -> None:
    """Older releases [seen]: ``... Enter time region`` opens a region, ``[sg00/Tensorizer/LoopFusion]:
    Exit time region: delta=2.437s`` closes the innermost one and adds its time (in seconds)."""
    if "time region" not in line:
        return
    idx = line.find(_EXIT_REGION)
    if idx < 0:
        idx = line.find(_ENTER_REGION)
        if idx >= 0:
            acc.open_regions.append(_region_tag(line, idx))
            if len(acc.open_regions) > _MAX_OPEN_REGIONS:
                del acc.open_regions[0]
        return
    m = _DELTA_RE.match(line, idx + len(_EXIT_REGION))
    if not m:
        return
    # Named by its own tag, else by the tag of the innermost open region, else region_<n>.
    name = _region_tag(line, idx)
    enter_name = acc.open_regions.pop() if acc.open_regions else ""
    if not name:
        name = enter_name
    if not name:
        acc.unnamed_regions += 1
        name = f"region_{acc.unnamed_regions}"
    seconds = _parse_seconds(m.group(1))
    if seconds is None:
        acc.note(lineno, f"region time {short(m.group(1))!r} is not a time")
    else:
        acc.add_time(name, seconds)


def _region_tag(line: str, end: int) -> str:
    """The last ``/`` component of a ``[logger/name]`` tag just before ``line[end:]``, or ""."""
    head = line[:end].rstrip(" \t:")
    if not head.endswith("]"):
        return ""
    tag = head[head.rfind("[") + 1 : -1]
    return tag.rsplit("/", 1)[-1].strip()


def _diagnostic_line(acc: Accumulator, line: str, lineno: int) -> None:
    """The first coded diagnostic on the line [doc, seen]: ``[XCG815] ...`` or ``NCC_EOOM001 ...``."""
    m = _OLD_CODE_RE.search(line) if "[" in line else None
    if "NCC_" in line:
        m_ncc = _NCC_CODE_RE.search(line)
        if m_ncc and (m is None or m_ncc.start() < m.start()):
            m = m_ncc
    if not m:
        return
    code = m.group(1)
    severity = _severity(code, line[: m.start()])
    if severity == "error":
        acc.error_signal = True
    message = line[m.end():].lstrip(" \t:-]")
    acc.diagnostics.add(Diagnostic(code, _clip(message), lineno, severity))


def _severity(code: str, before: str) -> str:
    """``NCC_W*`` warning, ``NCC_I*`` info, other ``NCC_*`` error; a bracketed code is an error unless
    a WARN/WARNING/INFO level word is ``before`` it on the line [guess]."""
    if code.startswith("NCC_"):
        return {"W": "warning", "I": "info"}.get(code[4:5], "error")
    if _LEVEL_WARN_RE.search(before):
        return "warning"
    if _LEVEL_INFO_RE.search(before):
        return "info"
    return "error"


def _internal_error_line(acc: Accumulator, line: str, lineno: int) -> None:
    """``<timestamp> ERROR <pid> [neuronx-cc]: text`` [seen]: an error signal; the text is kept unless
    it is empty or only decoration."""
    if "cc]" not in line:
        return
    m = _INTERNAL_RE.search(line)
    if not m:
        return
    acc.error_signal = True
    body = m.group(1).rstrip()
    if not _DECORATION_RE.fullmatch(body):
        acc.internal_errors.add(InternalError("error", _clip(body), lineno))


#: libneuronxla wrapper lines [doc, seen]: (key text, pattern, CacheEvent kind).  Only the first entry
#: whose key text is on the line is tried.
_WRAPPER_LINES = (
    ("compiler with cmd", _CMD_RE, "compile_cmd"),
    ("cached neff", _CACHE_HIT_RE, "cache_hit"),
    ("cached failed neff", _CACHE_FAILED_RE, "cache_failed"),
    ("Compilation failed", _COMPILE_FAILED_RE, "compile_failed"),
)


def _wrapper_line(acc: Accumulator, line: str, lineno: int) -> None:
    """A libneuronxla wrapper line -> a :class:`CacheEvent`; "compile_cmd" also sets the compiler
    command, "compile_failed" is an error signal."""
    for key, pattern, kind in _WRAPPER_LINES:
        if key in line:
            m = pattern.search(line)
            if m:
                detail = _clip(m.group(1))
                if kind == "compile_cmd":
                    acc.compiler_command = detail
                elif kind == "compile_failed":
                    acc.error_signal = True
                acc.cache_events.add(CacheEvent(kind, detail, lineno))
            return


class _Recogniser(NamedTuple):
    """A recogniser, and the texts one of which must occur in a log for it to find anything there."""

    keys: tuple[str, ...]
    handle: Callable[[Accumulator, str, int], None]


#: Every recogniser, in the order they look at a line.
RECOGNISERS = (
    _Recogniser(("Compiler status",), _status_line),
    _Recogniser(("op count",), _op_count_line),
    _Recogniser(("Compile time",), _compile_time_line),
    _Recogniser(("instructions",), _instruction_count_line),
    # Without a "finished after" line, "Running <pass>" lines have nothing to name.
    _Recogniser((_FINISHED,), _pass_line),
    _Recogniser(("time region",), _time_region_line),
    _Recogniser(("[", "NCC_"), _diagnostic_line),
    _Recogniser(("cc]",), _internal_error_line),
    _Recogniser(tuple(key for key, _, _ in _WRAPPER_LINES), _wrapper_line),
)
