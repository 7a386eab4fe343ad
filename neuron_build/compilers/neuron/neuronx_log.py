"""Parse the log of a neuronx-cc compile into a :class:`LogSummary`.

There is no single documented summary format for neuronx-cc logs, so this module recognises every
format listed below (``neuron-build parse-log``, ``docs/neuron.md``) and tolerates everything else.
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

import re

from neuron_build.compilers.neuron.log_summary import (
    CacheEvent,
    Diagnostic,
    InternalError,
    LogSummary,
    failure_reason,
    first_diagnostic_line,
)
from neuron_build.compilers.neuron.neuronx_log_lines import RECOGNISERS, TB_START, Accumulator, short, traceback_line

__all__ = [
    "CacheEvent",
    "Diagnostic",
    "InternalError",
    "LogSummary",
    "failure_reason",
    "first_diagnostic_line",
    "parse_log",
]

_SURROGATE_ESCAPES_RE = re.compile("[\udc80-\udcff]")


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
            unparsed=(f"internal parser error: {type(exc).__name__}: {short(str(exc))}",),
        )


def _split_lines(text: str) -> list[str]:
    """The lines of ``text`` without their ``\\n`` and trailing ``\\r``s (a last line without a
    newline counts; an empty text has none)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.rstrip("\r") for line in lines]
    return lines


def _whole_log_notes(text: str, replaced: int, first_bad_line: int | None, lines: int) -> list[str]:
    """The notes about the log as a whole, listed before the per-line notes."""
    notes = []
    if not text.strip():
        notes.append("log is empty" if not text else "log is empty (whitespace only)")
    if replaced:
        notes.append(f"{replaced} non-UTF-8 byte(s) replaced with U+FFFD (first on line {first_bad_line})")
    if text and not text.endswith("\n"):
        notes.append(f"log ends mid-line (no newline after line {lines})")
    return notes


def _parse_text(text: str, replaced: int, first_bad_line: int | None) -> LogSummary:
    """Parse decoded ``text`` in one pass over its lines (see the section comment in :mod:`.neuronx_log_lines`)."""
    lines = _split_lines(text)
    head = _whole_log_notes(text, replaced, first_bad_line, len(lines))
    handlers = [r.handle for r in RECOGNISERS if any(key in text for key in r.keys)]
    tracebacks = TB_START in text  # otherwise the state machine never leaves OUTSIDE
    acc = Accumulator()
    for lineno, line in enumerate(lines, 1):
        if tracebacks and traceback_line(acc, line, lineno):
            continue
        for handle in handlers:
            handle(acc, line, lineno)
    return acc.summary(head, len(lines), replaced, text)
