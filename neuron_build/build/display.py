"""What a build shows while it runs: N of M done, what is compiling for how long, and an ETA from the
recorded compile times.

On a terminal (stderr is a TTY, ``TERM`` is not ``dumb`` and rich is installed) a :class:`BuildDisplay`
keeps a live area at the bottom of the screen, redrawn about once a second by a background thread::

    ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 3/10 done (1 failed) · ETA 1m05s
    compiling minilm/b8-s32/fp32/o2 (42 s, usually 60 s)
    compiling minilm/b8-s64/fp32/o2 (12 s)

with one line printed above it per finished target. Elsewhere (CI, pipes, tests) it prints only those
lines, ``[3/10] minilm/b8-s32/fp32/o2 PASS in 41.7 s; 7 left, about 1m05s``. Colour follows
:func:`neuron_build.log.use_color` (``NO_COLOR`` turns every escape code for colour and style off,
``FORCE_COLOR`` turns colour on). rich is imported when the live area first shows, i.e. when the first
compile starts: never by a no-op build.

Thread-safe: the compile threads of doit's thread runner call :meth:`BuildDisplay.started` and
:meth:`BuildDisplay.finished`; only the process that made the display draws (a ``doit -P process`` runner
forked from it does nothing).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from neuron_build.build.progress import BuildProgress, estimate_eta, format_duration, pace
from neuron_build.log import divert_stderr, use_color
from neuron_build.status import BuildResult, Status

#: seconds between two redraws of the live area
REFRESH_S = 1.0
#: running targets named in the live area (the rest as "+N more")
MAX_RUNNING_SHOWN = 8


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


#: SGR codes of the status word in a plain (not live) line: PASS green, cached dim, anything else bold red.
_SGR = {Status.PASS: "32", BuildResult.CACHED: "2"}


def _ansi_status(text: str, status: str) -> str:
    """``text`` with its first `` <status>`` word wrapped in the ANSI colour of that status."""
    at = text.find(f" {status}")
    if at < 0:
        return text
    at += 1
    end = at + len(status)
    return f"{text[:at]}\x1b[{_SGR.get(status, '1;31')}m{text[at:end]}\x1b[0m{text[end:]}"


def wants_live(stream: Any = None) -> bool:
    """Whether a live display fits ``stream`` (default stderr): a terminal that is not ``TERM=dumb``, with
    rich installed (looked up, not imported)."""
    s = sys.stderr if stream is None else stream
    if os.environ.get("TERM") == "dumb" or not _isatty(s):
        return False
    return importlib.util.find_spec("rich") is not None


def make_console(stream: Any, terminal: bool | None = None, width: int | None = None):
    """A ``rich.console.Console`` writing to ``stream``: colour by :func:`~neuron_build.log.use_color`
    (with ``NO_COLOR``, ``color_system=None``: no escape code for colour or style at all); ``terminal``
    forces terminal handling on or off (None: rich decides, from ``stream.isatty()``); ``width`` in columns
    (None: the terminal's)."""
    from rich.console import Console

    color = use_color(stream)
    return Console(file=stream, force_terminal=terminal, color_system="auto" if color else None,
                   no_color=not color, highlight=False, soft_wrap=False, width=width)


class BuildDisplay:
    """The progress of one build, for people: live on a terminal, plain lines elsewhere.

    Args:
        total: targets this build compiles (M of "N of M"), or with ``pending`` None an upper bound that
            :meth:`skipped` lowers for each target found up to date; never below the targets started.
        slots: compiles at once (jobs); the ETA divides the remaining work by it (at least the number of
            compiles seen running at once).
        expect: target id -> its expected compile time in seconds (the last recorded one, see
            :func:`~neuron_build.build.peaks.expected_compile_time`), or None when never recorded;
            called once per target when it starts (in the compile's thread).
        pending: the targets known to be built, by id, with their expected compile times (seconds or
            None); then ``total`` is their number and :meth:`skipped` lowers it only for one of them.
            Targets beyond them count as the mean of the known times.
        stream: where the display goes (default ``sys.stderr`` as it is when the display is made).
        live: force the live area on or off (default: :func:`wants_live`).
        console: a ready ``rich.console.Console`` for the live area (tests: ``force_terminal=True`` on a
            StringIO); implies ``live``.
        clock: monotonic seconds (tests).
    """

    def __init__(self, total: int = 0, slots: int = 1, expect: Callable[[str], float | None] | None = None,
                 pending: Mapping[str, float | None] | None = None, stream: Any = None, live: bool | None = None,
                 console: Any = None, clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.slots = max(1, slots)
        self._expect = expect
        self._expected: dict[str, float | None] = dict(pending or {})
        self._pending = set(self._expected)
        self._exact = pending is not None   # total counts exactly the pending targets
        self._stream = stream if stream is not None else sys.stderr  # now: doit swaps sys.stderr per task
        self.live = (console is not None) or (wants_live(self._out()) if live is None else live)
        self._console = console
        self._clock = clock
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self._running: dict[str, float] = {}      # target id -> clock() when it started
        self._where: dict[str, str] = {}          # target id -> where it runs (a Dask worker), when told
        self._times: list[float] = []             # compile seconds of this build's finished compiles
        self._paced: list[tuple[float | None, float]] = []  # (recorded, real) seconds of those
        self._peak_running = 0
        self.done = 0
        self.failed = 0
        self._live: Any = None                    # rich.live.Live while the live area shows
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._stopped = False

    @property
    def showing(self) -> bool:
        """Whether the live area is on the screen now."""
        return self._live is not None

    def _out(self) -> Any:
        return self._stream

    def _mine(self) -> bool:
        return os.getpid() == self._pid

    # -- what the build reports -------------------------------------------------------------------------------
    def skipped(self, target_id: str) -> None:
        """``target_id`` needs no compile after all (doit found it up to date): one fewer to build."""
        with self._lock:
            if self._exact and target_id not in self._pending:
                return  # known not to need a compile: never counted
            self._pending.discard(target_id)
            self.total = max(self.total - 1, self.done + len(self._running))

    def started(self, target_id: str, where: str | None = None) -> None:
        """``target_id``'s build starts now (shows as ``compiling <target> (N s)``, or ``compiling <target>
        on <where> (N s)`` with a place, e.g. a Dask worker's address)."""
        if not self._mine():
            return
        if target_id in self._running:
            return
        expected = self._expect(target_id) if self._expect is not None and target_id not in self._expected \
            else self._expected.get(target_id)
        with self._lock:
            if target_id in self._running:
                return  # told twice (doit's reporter, then the build): it started the first time
            self._expected[target_id] = expected
            self._pending.discard(target_id)
            self._running[target_id] = self._clock()
            if where:
                self._where[target_id] = where
            self._peak_running = max(self._peak_running, len(self._running))
            self.total = max(self.total, self.done + len(self._running))
            if self.live and not self._stopped and self._live is None:
                self._start_live()
        self.refresh()

    def finished(self, out: Any) -> None:
        """The build of ``out.target`` ended with the :class:`~neuron_build.build.attempt.Outcome` ``out``
        (or anything with its ``target``, ``status``, ``ok``, ``compiled``): one line, ``[3/10] <target> PASS in 41.7 s; 7 left, about 1m05s``."""
        if not self._mine():
            return
        with self._lock:
            self._running.pop(out.target, None)
            self._pending.discard(out.target)
            self.done += 1
            self.failed += 0 if out.ok else 1
            self.total = max(self.total, self.done + len(self._running))
            ct = (getattr(out, "metrics", None) or {}).get("compile_time_s")
            if out.compiled and ct:
                self._times.append(float(ct))
                self._paced.append((self._expected.get(out.target), float(ct)))
            self.note(self.finished_line(out), status=str(out.status))  # under the lock: lines in order
        self.refresh()

    def note(self, text: str, status: str | None = None) -> None:
        """Print one line: above the live area when it shows, else on the stream. ``status`` colours the
        line's status word (PASS green, cached dim, anything else red) on a colour terminal."""
        if not self._mine():
            return
        with self._lock:
            live = self._live
            if live is None:  # one write per line, under the lock: lines of parallel compiles never mix
                out = self._out()
                if status and use_color(out):  # FORCE_COLOR on a pipe, or a terminal without the live area
                    text = _ansi_status(text, status)
                out.write(text + "\n")
                out.flush()
                return
        from rich.text import Text

        t = Text(text)
        if status:
            at = text.find(f" {status}")
            if at >= 0:
                style = "green" if status == Status.PASS else "dim" if status == BuildResult.CACHED else "bold red"
                t.stylize(style, at + 1, at + 1 + len(status))
        live.console.print(t)

    # -- what it shows ----------------------------------------------------------------------------------------
    def snapshot(self) -> BuildProgress:
        """N of M, the running targets (``running`` maps id -> ``"<seconds> s"`` so far) and the ETA."""
        with self._lock:
            now = self._clock()
            running = {t: format_duration(now - s) for t, s in self._running.items()}
            return BuildProgress(self.total, self.done, self.failed, running, self.eta_s(now))

    def eta_s(self, now: float | None = None) -> float | None:
        """Seconds until the build ends, by :func:`~neuron_build.build.progress.estimate_eta` over the
        recorded compile times of the running and pending targets, scaled by this build's :func:`pace`
        (real over recorded time of its finished compiles); a target never recorded counts as the mean of
        the recorded ones, else as the mean of this build's finished compiles. None when no time is known or
        nothing is left."""
        with self._lock:
            now = self._clock() if now is None else now
            left = self.total - self.done - len(self._running)
            if left <= 0 and not self._running:
                return None
            pending = [self._expected[t] for t in self._pending][:max(left, 0)]
            pending += [None] * (max(left, 0) - len(pending))
            running = [(self._expected.get(t), now - s) for t, s in self._running.items()]
            fallback = sum(self._times) / len(self._times) if self._times else None
            if fallback is not None and all(t is None for t in pending) and all(e is None for e, _ in running):
                pending = [fallback] * len(pending)
                running = [(fallback, ran) for _, ran in running]
            return estimate_eta(pending, running, max(self.slots, self._peak_running), pace(self._paced))

    def finished_line(self, out: Any) -> str:
        """``[3/10] <target> PASS in 41.7 s; 7 left, about 1m05s`` (the ETA part when one is known); a target
        checked again because a recorded input changed says why: ``PASS (re-checked: package pillow 10.0 ->
        11.0)``."""
        metrics = getattr(out, "metrics", None) or {}
        ct = next((metrics[k] for k in ("relink_time_s", "reuse_time_s", "compile_time_s") if k in metrics), None)
        # (a relink's or a graph reuse's compile time is its source's: the line says this build's seconds)
        line = f"[{self.done}/{self.total}] {out.target} {out.status}" + (f" in {ct:.1f} s" if ct is not None else "")
        why = tuple(getattr(out, "rechecked", ()) or ())
        if why:
            line += f" (re-checked: {why[0]}" + (f" and {len(why) - 1} more" if len(why) > 1 else "") + ")"
        left = self.total - self.done
        eta = self.eta_s()
        if left > 0 and eta is not None:
            line += f"; {left} left, about {format_duration(eta)}"
        return line

    def status_lines(self) -> list[str]:
        """The live area as text: ``3/10 done (1 failed) · ETA 1m05s``, then one ``compiling <target> (42 s,
        usually 60 s)`` per running target, longest-running first."""
        with self._lock:
            now = self._clock()
            p = self.snapshot()
            head = f"{p.done}/{p.total} done" + (f" ({p.failed} failed)" if p.failed else "")
            if p.eta_s is not None and p.done < p.total:
                head += f" · ETA {format_duration(p.eta_s)}"
            lines = [head]
            items = sorted(self._running.items(), key=lambda kv: (kv[1], kv[0]))
            for tid, since in items[:MAX_RUNNING_SHOWN]:
                exp = self._expected.get(tid)
                usual = f", usually {format_duration(exp)}" if exp else ""
                on = f" on {self._where[tid]}" if tid in self._where else ""
                lines.append(f"compiling {tid}{on} ({format_duration(now - since)}{usual})")
            if len(items) > MAX_RUNNING_SHOWN:
                lines.append(f"+{len(items) - MAX_RUNNING_SHOWN} more compiling")
            return lines

    def _renderable(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        lines = self.status_lines()
        with self._lock:
            total, done = self.total, self.done
        head = Table.grid(padding=(0, 1))
        head.add_column(width=30)
        head.add_column()
        head.add_row(ProgressBar(total=max(total, 1), completed=done, width=30), Text(lines[0], style="bold"))
        rest = [Text(ln[:10], style="cyan") + Text(ln[10:]) if ln.startswith("compiling ") else Text(ln, style="dim")
                for ln in lines[1:]]
        return Group(head, *rest)

    # -- the live area ----------------------------------------------------------------------------------------
    def _start_live(self) -> None:
        from rich.live import Live

        console = self._console if self._console is not None else make_console(self._out(), terminal=True)
        # no redirection of sys.stdout/sys.stderr: doit's runner threads swap them around each task. Log
        # events go above the live area through divert_stderr, doit's report through BuildReporter.write
        self._live = Live(self._renderable(), console=console, auto_refresh=False, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()
        divert_stderr(self._log_line)
        self._ticker = threading.Thread(target=self._tick, name="neuron-build-progress", daemon=True)
        self._ticker.start()

    def _log_line(self, message: str) -> None:
        """A log event rendered for stderr, printed above the live area."""
        with self._lock:
            live = self._live
        if live is None:
            self._out().write(message + "\n")
            return
        from rich.text import Text

        live.console.print(Text.from_ansi(message))

    def _tick(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self.refresh()

    def refresh(self) -> None:
        """Redraw the live area now (the ticker does it every :data:`REFRESH_S` seconds)."""
        with self._lock:
            live = self._live
            if live is not None and not self._stopped:
                live.update(self._renderable(), refresh=True)

    def stop(self) -> None:
        """Stop the ticker and take the live area off the screen (idempotent; also after Ctrl-C or a
        failure). Lines printed stay."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            live, self._live = self._live, None
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=5)
        if live is not None:
            divert_stderr(None)
            live.stop()

    def __enter__(self) -> BuildDisplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


__all__ = ["MAX_RUNNING_SHOWN", "REFRESH_S", "BuildDisplay", "make_console", "wants_live"]
