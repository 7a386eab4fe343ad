"""structlog set-up: human-readable on a terminal (or with ``FORCE_COLOR``), JSON lines otherwise, and always JSON lines appended
to the project's build log (``<state_dir>/build.log``).

structlog is imported on the first event, not at import: a no-op build logs nothing and never pays for
it. :func:`configure` records the settings and :func:`get_logger` returns a :class:`LazyLogger`; both take
effect when something is logged.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

_log_file: Path | None = None
_pending: tuple[bool | None, bool] | None = (None, False)  # (json_lines, quiet) not applied to structlog yet
_configuring = threading.Lock()
#: while a live progress display shows: where the events rendered for stderr go instead (one call per
#: event, the rendered line), and info and debug events go to the build log only
_sink: Any = None
#: events that go to the build log only while a live progress display shows: the display's line for the
#: target and the build's summary already say it (``compile failed``: status, reason, log command)
SHOWN_BY_DISPLAY = frozenset({"compile failed"})


def _tee(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """Append the event as one JSON line to the build log (O_APPEND: safe across processes)."""
    if _log_file is not None:
        line = json.dumps({k: v for k, v in event.items()}, default=str) + "\n"
        try:
            fd = os.open(_log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    return event


def use_color(stream: Any = None) -> bool:
    """Whether to colour output on ``stream`` (default stderr), by the usual conventions: ``NO_COLOR``
    set to anything non-empty turns colour off (https://no-color.org), ``FORCE_COLOR`` non-empty turns it
    on even when not a terminal; otherwise colour only on a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    s = stream if stream is not None else sys.stderr
    return bool(getattr(s, "isatty", lambda: False)())


def configure(log_file: Path | None = None, json_lines: bool | None = None, quiet: bool = False) -> None:
    """Configure logging for this process (applied to structlog on the first event).

    Args:
        log_file: the build log to append every event to (its folder is created), or None.
        json_lines: force JSON (True) or console (False) rendering on stderr; default: console on a TTY or
            with ``FORCE_COLOR`` (not ``NO_COLOR``), else JSON lines.
        quiet: render only warnings and errors on stderr (the build log still gets everything).
    """
    global _log_file, _pending
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
    _log_file = log_file
    _pending = (json_lines, quiet)


def _structlog():
    """structlog, configured with the settings :func:`configure` recorded last (once, under a lock: the
    first events of parallel compile threads must all reach the build log)."""
    import structlog

    if _pending is None:
        return structlog
    with _configuring:
        if _pending is not None:
            _apply(structlog, *_pending)
    return structlog


def _apply(structlog, json_lines: bool | None, quiet: bool) -> None:
    global _pending
    if json_lines is None:  # FORCE_COLOR asks for the coloured console lines on a pipe too
        json_lines = not (sys.stderr.isatty() or (os.environ.get("FORCE_COLOR") and not os.environ.get("NO_COLOR")))
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(
        colors=use_color(sys.stderr))

    def _filter(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if (quiet or _sink is not None) and method in ("debug", "info"):
            raise structlog.DropEvent
        if _sink is not None and event.get("event") in SHOWN_BY_DISPLAY:
            raise structlog.DropEvent
        return event

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True), _tee, _filter, renderer],
        logger_factory=lambda *args: _StderrLogger(structlog),
        cache_logger_on_first_use=False,
    )
    _pending = None


def _StderrLogger(structlog: Any) -> Any:
    """A structlog PrintLogger on ``sys.stderr`` as it is at each event, or on the sink of
    :func:`divert_stderr` while one is set."""
    global _StderrLoggerClass
    if _StderrLoggerClass is None:
        class StderrLogger(structlog.PrintLogger):
            def msg(self, message: str) -> None:
                sink = _sink
                if sink is not None:
                    sink(message)
                    return
                with self._lock:
                    print(message, file=sys.stderr, flush=True)

            log = debug = info = warn = warning = msg
            fatal = failure = err = error = critical = exception = msg

        _StderrLoggerClass = StderrLogger
    return _StderrLoggerClass(sys.stderr)


_StderrLoggerClass: Any = None


def divert_stderr(sink: Any) -> None:
    """While ``sink`` (a callable taking one rendered line) is set, log events meant for stderr go to it,
    warnings and errors only, less those of :data:`SHOWN_BY_DISPLAY`: a live progress display prints them
    above its area, and already shows what info events such as ``still compiling`` say (the summary a
    failed compile's reason). The build log still gets every event. None: back to stderr."""
    global _sink
    _sink = sink


class LazyLogger:
    """A structlog bound logger made on first use: ``bind`` returns another LazyLogger, every other
    attribute (``info``, ``warning``, ...) is the real logger's."""

    __slots__ = ("_bound", "_real")

    def __init__(self, bound: dict[str, Any]):
        self._bound = bound
        self._real = None

    def bind(self, **more: Any) -> LazyLogger:
        return LazyLogger({**self._bound, **more})

    def __getattr__(self, name: str) -> Any:
        if self._real is None or _pending is not None:
            self._real = _structlog().get_logger("neuron_build").bind(**self._bound)
        return getattr(self._real, name)


def get_logger(**bound: Any) -> LazyLogger:
    """A logger with ``bound`` context (e.g. ``target=..., key=...``); structlog loads on the first event."""
    return LazyLogger(bound)


__all__ = ["SHOWN_BY_DISPLAY", "LazyLogger", "configure", "divert_stderr", "get_logger", "use_color"]
