"""``neuron-build parse-log FILE [--json]``: summarise a neuronx-cc compiler log."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TextIO

from neuron_build.cli.app import command, json_doc
from neuron_build.compilers.neuron.neuronx_log import (
    LogSummary,
    failure_reason,
    parse_log,
)
from neuron_build.errors import ExitCode, UserError
from neuron_build.status import Status

__all__ = ["check_log_file", "format_summary", "parse_log_main", "register"]

#: Pass times shown in the human summary.
TOP_PASSES = 10

# C0 controls except tab, DEL, C1 controls and lone surrogates: never written raw to a terminal.
_UNSAFE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def register(add) -> None:
    """Add the ``parse-log`` sub-command."""
    s = add("parse-log", "print what neuron-build extracts from a neuronx-cc log")
    s.add_argument("file", metavar="FILE")
    s.add_argument("--json", action="store_true")


def _safe(text: str) -> str:
    return _UNSAFE_RE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                          else f"\\u{ord(m.group()):04x}", text)


def format_summary(summary: LogSummary, path: str) -> str:
    """Return the human-readable summary of a parsed log (times in seconds), ending with a newline."""
    out: list[str] = [f"log: {_safe(path)} ({summary.lines} lines)"]
    out.append(f"status: {summary.status or 'unknown (the log does not say)'}")
    reason = failure_reason(summary) if summary.status == Status.ERROR else None
    if reason:
        out.append(f"reason: {_safe(reason)}")
    if summary.op_count is not None:
        out.append(f"op count: {summary.op_count}")
    if summary.compile_time_s is not None:
        out.append(f"compile time: {summary.compile_time_s:g} s")
    if summary.instruction_count is not None:
        out.append(f"instruction count: {summary.instruction_count}")
    if summary.compiler_command:
        out.append(f"compiler command: {_safe(summary.compiler_command)}")
    if summary.pass_times:
        ranked = sorted(summary.pass_times.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_PASSES]
        out.append(f"pass times (top {len(ranked)} of {len(summary.pass_times)}, seconds):")
        width = max(len(name) for name, _ in ranked)
        out.extend(f"  {_safe(name):<{width}}  {seconds:10.3f}" for name, seconds in ranked)
    if summary.diagnostics:
        out.append(f"diagnostics ({len(summary.diagnostics)}):")
        out.extend(f"  line {d.line}: {d.code} ({d.severity}): {_safe(d.message)}" for d in summary.diagnostics)
    if summary.internal_errors:
        out.append(f"internal errors ({len(summary.internal_errors)} lines):")
        out.extend(f"  line {e.line}: {_safe(e.text)}" for e in summary.internal_errors)
    if summary.cache_events:
        out.append(f"compiler wrapper ({len(summary.cache_events)} lines):")
        out.extend(f"  line {c.line}: {c.kind}: {_safe(c.detail)}" for c in summary.cache_events)
    if summary.unparsed:
        out.append("could not parse:")
        out.extend(f"  - {_safe(note)}" for note in summary.unparsed)
    return "\n".join(out) + "\n"


def parse_log_main(path: str, as_json: bool, out: TextIO | None = None) -> int:
    """Read the log at ``path`` as bytes, print a summary (or its JSON with ``as_json``), return 0.

    Raises ``FileNotFoundError`` / ``IsADirectoryError`` / ``PermissionError`` (other ``OSError``s as
    ``OSError``) with a one-line message naming the file; the CLI maps them to a user error.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"compiler log not found: {path}") from exc
    except IsADirectoryError as exc:
        raise IsADirectoryError(f"compiler log is a directory, not a file: {path}") from exc
    except PermissionError as exc:
        raise PermissionError(f"cannot read compiler log {path}: permission denied") from exc
    except OSError as exc:
        raise OSError(f"cannot read compiler log {path}: {exc.strerror or exc}") from exc
    summary = parse_log(data)
    text = json.dumps(json_doc(summary.to_json(), name="parse-log"), indent=2) + "\n" if as_json else format_summary(summary, path)
    stream = out if out is not None else sys.stdout
    try:
        stream.write(text)
    except UnicodeEncodeError:
        stream.write(text.encode("ascii", "backslashreplace").decode("ascii"))
    stream.flush()
    return ExitCode.OK


def check_log_file(file: str) -> Path:
    """The path of ``file`` when it is a readable file that looks like text (its first 8 KiB).

    Raises:
        UserError: a folder, a missing or unreadable file, or binary data.
    """
    p = Path(file)
    if p.is_dir():
        raise UserError(f"{file} is a folder; pass the path of a neuronx-cc log file")
    if not p.is_file():
        raise UserError(f"{file}: no such file; pass the path of a neuronx-cc log")
    try:
        with open(p, "rb") as f:
            head = f.read(8192)
    except OSError as e:
        raise UserError(f"{file}: cannot read it ({e.strerror})") from None
    bad = len(head) - len(head.decode("utf-8", "ignore").encode()) if head else 0
    if b"\0" in head or (head and bad > len(head) // 4):
        raise UserError(f"{file} is binary data, not a neuronx-cc log (a text file, e.g. log-neuron-cc.txt)")
    return p


@command("parse-log")
def cmd_parse_log(args) -> int:
    """What neuron-build reads from a neuronx-cc log."""
    p = check_log_file(args.file)
    try:
        return parse_log_main(str(p), args.json)
    except OSError as e:  # unreadable: parse_log_main's message names the file
        raise UserError(str(e)) from None
