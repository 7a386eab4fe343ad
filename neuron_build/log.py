"""structlog set-up: human-readable on a terminal, JSON lines otherwise, and always JSON lines appended
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


def configure(log_file: Path | None = None, json_lines: bool | None = None, quiet: bool = False) -> None:
    """Configure logging for this process (applied to structlog on the first event).

    Args:
        log_file: the build log to append every event to (its folder is created), or None.
        json_lines: force JSON (True) or console (False) rendering on stderr; default: console on a TTY.
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
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    renderer = structlog.processors.JSONRenderer() if json_lines else structlog.dev.ConsoleRenderer(
        colors=sys.stderr.isatty())

    def _filter(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if quiet and method in ("debug", "info"):
            raise structlog.DropEvent
        return event

    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True), _tee, _filter, renderer],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _pending = None


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
