"""Timing of callables on a device: the timing settings of a benchmark session, the timers and the
latency statistics (see :mod:`neuron_build.evaluate.bench` for the session that uses them).

:func:`time_rounds` times several callables together in rounds (every callable once per round, the order
rotated, each call ended by the device's synchronise, :func:`device_sync`, and timed with
``time.perf_counter_ns``), a fixed or an adaptive number of rounds. :func:`time_calls` and
:func:`time_interleaved` are the single-target timers (kept for scripts). Torch is imported inside the
functions only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_build.errors import UserError
from neuron_build.util import median_ci, percentile

DEFAULT_WARMUP = 10
DEFAULT_ITERS = 100
#: Adaptive timing (``iters=None``): at least this many rounds ...
MIN_ITERS = 30
#: ... then until every median's confidence interval is within ``PRECISION`` of it (relative half-width) ...
PRECISION = 0.02
#: ... or this many seconds have passed, warm-up included, or :data:`MAX_ITERS` rounds.
MAX_TIME_S = 60.0
MAX_ITERS = 5000
#: Confidence of the median intervals recorded with every benchmark.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class TimingSettings:
    """How one benchmark session times its callables; built once (``neuron-build bench`` builds it from
    its options) and passed whole.

    Attributes:
        warmup: untimed rounds first (>= 0).
        iters: timed rounds (>= 1), or None: adaptive (``min_iters``, ``precision``, ``max_time_s``,
            ``max_iters``).
        min_iters: adaptive: at least this many rounds (>= 1).
        precision: adaptive: stop when every decisive median's interval half-width is at most this
            fraction of the median.
        max_time_s: adaptive: the session's budget in seconds, warm-up included (:func:`time_rounds`).
        max_iters: adaptive: at most this many rounds.
        confidence: of the median intervals (recorded with every benchmark).
        threads: torch intra-op threads for the session (``torch.set_num_threads``; None: torch's default).
        eager: also time each target's eager model, interleaved with the artifacts.
    """

    warmup: int = DEFAULT_WARMUP
    iters: int | None = None
    min_iters: int = MIN_ITERS
    precision: float = PRECISION
    max_time_s: float = MAX_TIME_S
    max_iters: int = MAX_ITERS
    confidence: float = CONFIDENCE
    threads: int | None = None
    eager: bool = True

    def check(self) -> None:
        """Raise UserError for settings no session can run with (the options' names in the message)."""
        if (self.iters is not None and self.iters < 1) or self.warmup < 0 or self.min_iters < 1:
            raise UserError(f"--iters must be >= 1 and --warmup >= 0 (got iters {self.iters}, warmup {self.warmup})")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be >= 1 (got {self.threads})")

    @property
    def timing(self) -> str:
        """How the artifacts were timed, as the records say it: ``interleaved with eager`` or ``compiled only``."""
        return "interleaved with eager" if self.eager else "compiled only"

    def describe(self) -> str:
        """``warm-up N, M timed rounds`` or the adaptive rule, as ``bench`` announces a session."""
        how = f"{self.iters} timed rounds" if self.iters else (
            f"adaptive rounds (>= {self.min_iters}, to +-{self.precision:.0%}; at most {self.max_time_s:g} s in all)")
        return f"warm-up {self.warmup}, {how}" + (", interleaved with eager" if self.eager else "")


def latency_stats(samples_ms: Sequence[float]) -> dict[str, float]:
    """``p50``, ``p90``, ``p99``, ``mean``, ``min``, ``max``, ``std`` (population) of latencies in ms.

    Raises:
        ValueError: no samples.
    """
    s = sorted(samples_ms)
    if not s:
        raise ValueError("no latency samples")
    mean = sum(s) / len(s)
    std = (sum((x - mean) ** 2 for x in s) / len(s)) ** 0.5
    return {"p50": percentile(s, 50), "p90": percentile(s, 90), "p99": percentile(s, 99), "mean": mean,
            "min": s[0], "max": s[-1], "std": std}


def device_sync(device_kind: str) -> tuple[Callable[[], None], str]:
    """The call that waits for the device's queued work, and its name.

    - ``cuda``: ``torch.cuda.synchronize`` (kernels launch asynchronously) [doc].
    - ``neuron``: ``torch_xla.core.xla_model.wait_device_ops`` when torch-xla is importable; otherwise
      none, because a ``torch_neuronx.trace`` model is called with CPU tensors and returns CPU tensors,
      so its work has finished when the call returns [guess: verify on a Neuron host].
    - ``cpu``: none (CPU ops run synchronously).
    """
    if device_kind == "cuda":
        import torch
        return torch.cuda.synchronize, "torch.cuda.synchronize"
    if device_kind == "neuron":
        try:
            import torch_xla.core.xla_model as xm  # type: ignore[import-not-found]
            return xm.wait_device_ops, "torch_xla.core.xla_model.wait_device_ops [guess]"
        except Exception:
            return (lambda: None), "none: the traced model returns host tensors [guess]"
    return (lambda: None), "none (cpu)"


def time_calls(fn: Callable, inputs: tuple, warmup: int, iters: int, sync: Callable[[], None],
               progress: Any = None) -> list[float]:
    """Latencies in ms of ``iters`` calls ``fn(*inputs)``, each ended by ``sync()``, after ``warmup``
    untimed calls. ``progress`` (a tqdm bar or None) is advanced once per call, warm-up included."""
    import torch

    out: list[float] = []
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*inputs)
            sync()
            if progress is not None:
                progress.update(1)
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            fn(*inputs)
            sync()
            out.append((time.perf_counter_ns() - t0) / 1e6)
            if progress is not None:
                progress.update(1)
    return out


def time_interleaved(fns: Sequence[Callable], inputs: tuple, warmup: int, iters: int, sync: Callable[[], None],
                     progress: Any = None) -> list[list[float]]:
    """Latencies in ms of several callables on the same inputs, timed call by call in alternation.

    After ``warmup`` untimed rounds (each callable once per round), ``iters`` timed rounds: each callable
    is called once per round, the order reversed every other round (A B, B A, A B, ...), each call ended
    by ``sync()`` and timed on its own. A change of load on the host during the run then hits every
    callable alike, so their ratio stays meaningful on a busy machine. ``progress`` advances once per
    round, warm-up included.

    Returns:
        One list of ``iters`` latencies per callable, in the order of ``fns``.
    """
    import torch

    out: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns:
                fn(*inputs)
                sync()
            if progress is not None:
                progress.update(1)
        for it in range(iters):
            for i in (order if it % 2 == 0 else order[::-1]):
                t0 = time.perf_counter_ns()
                fns[i](*inputs)
                sync()
                out[i].append((time.perf_counter_ns() - t0) / 1e6)
            if progress is not None:
                progress.update(1)
    return out



#: Adaptive timing: the share of ``max_time_s`` warm-up may take; the timed rounds get the rest.
WARMUP_SHARE = 0.25
#: Seconds between the progress lines of a session (``note``).
PROGRESS_EVERY_S = 15.0


def time_rounds(fns: Sequence[Callable], inputs: Sequence[tuple], syncs: Sequence[Callable[[], None]],
                settings: TimingSettings, *, decide: Sequence[int] | None = None, progress: Any = None,
                clock: Callable[[], float] = time.monotonic, note: Callable[[str], None] | None = None,
                rounds: dict[str, int] | None = None) -> tuple[list[list[float]], str]:
    """Latencies in ms of several callables, timed in rounds: each round calls every callable once on its
    own inputs, in an order rotated by one each round (so no callable is always first after another's
    cache traffic), each call ended by its ``sync`` and timed with ``time.perf_counter_ns``. A change of
    load on the host during the run hits every callable alike, so their ratios stay meaningful on a busy
    machine.

    The number of rounds (``settings``, :class:`TimingSettings`): exactly ``warmup`` untimed then ``iters``
    timed rounds when ``iters`` is given (not bounded in time: ``note`` is told what they will take once
    the first round is timed); otherwise adaptive, and **``max_time_s`` bounds the whole session, warm-up
    included**: warm-up stops after ``warmup`` rounds or :data:`WARMUP_SHARE` of the budget, then timed
    rounds run until the median of every callable in ``decide`` (indices; default all) has a confidence
    interval (:func:`neuron_build.util.median_ci` at ``confidence``) whose half-width is at most
    ``precision`` times the median (checked from ``min_iters`` rounds on), or the budget is spent (then
    also below ``min_iters``; at least one timed round), or ``max_iters`` rounds. A round is never cut,
    so the session ends at most one round after the budget.

    Args:
        progress: advanced once per round (warm-up included), or None.
        clock: seconds, for the budget (tests pass a fake one).
        note: called with one line: what the session will take (after its first round), then progress
            every :data:`PROGRESS_EVERY_S` seconds (rounds done, seconds spent of the budget).
        rounds: if given, ``rounds["warmup"]`` is set to the warm-up rounds run (fewer than ``warmup``
            when the budget cut warm-up short), for the record.

    Returns:
        One list of latencies (ms) per callable, in the order of ``fns``; and why timing stopped:
        ``"iters"`` (the fixed count), ``"precision"``, ``"time"`` or ``"max_iters"``.
    """
    import torch

    session = _Rounds(fns, inputs, syncs, settings, list(range(len(fns))) if decide is None else list(decide),
                      progress, clock, note or (lambda _line: None))
    with torch.inference_mode():
        session.warm_up(rounds)
        return session.out, session.timed()


class _Rounds:
    """One :func:`time_rounds` session: its callables, its budget clock, its notes and the latencies so far."""

    def __init__(self, fns: Sequence[Callable], inputs: Sequence[tuple], syncs: Sequence[Callable[[], None]],
                 settings: TimingSettings, watch: list[int], progress: Any, clock: Callable[[], float],
                 say: Callable[[str], None]) -> None:
        self.fns, self.inputs, self.syncs, self.s = fns, inputs, syncs, settings
        self.watch, self.progress, self.clock, self.say = watch, progress, clock, say
        self.out: list[list[float]] = [[] for _ in fns]
        self.t0 = self.last_note = clock()

    def precise(self) -> bool:
        """Every watched median's confidence interval is within ``precision`` of it."""
        for i in self.watch:
            med, lo, hi = median_ci(self.out[i], self.s.confidence)
            if med <= 0 or (hi - lo) / 2 > self.s.precision * med:
                return False
        return True

    def first_round(self, seconds: float) -> None:
        """Say what the session will take, from its first round's ``seconds``."""
        s = self.s
        if s.iters is not None:
            self.say(f"one round takes {seconds:.3g} s: {s.warmup} warm-up + {s.iters} timed rounds will take about "
                     f"{seconds * (s.warmup + s.iters):.0f} s (--iters is not bounded by --max-time)")
            return
        fit = int(s.max_time_s / seconds) if seconds > 0 else s.max_iters
        cut = ("" if fit >= s.warmup + s.min_iters else
               f"; the budget holds about {fit} rounds, fewer than warm-up {s.warmup} + --min-iters {s.min_iters}: "
               f"warm-up stops at {WARMUP_SHARE:.0%} of it and timing at {s.max_time_s:g} s")
        self.say(f"one round takes {seconds:.3g} s: at most {s.max_time_s:g} s in all, warm-up included "
                 f"(--max-time){cut}")

    def tick(self, r: int, label: str) -> None:
        """Say how far the session is, every :data:`PROGRESS_EVERY_S` seconds."""
        now = self.clock()
        if now - self.last_note >= PROGRESS_EVERY_S:
            self.last_note = now
            budget = "" if self.s.iters is not None else f" of {self.s.max_time_s:g}"
            self.say(f"{label} round {r}, {now - self.t0:.0f}{budget} s")

    def advance(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def warm_up(self, rounds: dict[str, int] | None) -> None:
        """The untimed rounds: ``warmup`` of them, or fewer when :data:`WARMUP_SHARE` of the budget is spent."""
        s, n = self.s, len(self.fns)
        for w in range(s.warmup):
            for i in range(n):
                self.fns[i](*self.inputs[i])
                self.syncs[i]()
            self.advance()
            if w == 0:
                self.first_round(self.clock() - self.t0)
            self.tick(w + 1, "warm-up")
            if rounds is not None:
                rounds["warmup"] = w + 1
            if s.iters is None and self.clock() - self.t0 >= WARMUP_SHARE * s.max_time_s:
                break

    def timed(self) -> str:
        """The timed rounds, each in an order rotated by one; returns why they stopped."""
        s, n = self.s, len(self.fns)
        r = 0
        while True:
            t_round = self.clock()
            for j in range(n):
                i = (j + r) % n
                t1 = time.perf_counter_ns()
                self.fns[i](*self.inputs[i])
                self.syncs[i]()
                self.out[i].append((time.perf_counter_ns() - t1) / 1e6)
            r += 1
            self.advance()
            if r == 1 and s.warmup == 0:
                self.first_round(self.clock() - t_round)
            self.tick(r, "timed")
            if s.iters is not None:
                if r >= s.iters:
                    return "iters"
                continue
            if r >= s.max_iters:
                return "max_iters"
            if r >= s.min_iters and r % 10 == 0 and self.precise():
                return "precision"
            if self.clock() - self.t0 >= s.max_time_s:
                return "time"


__all__ = ["CONFIDENCE", "DEFAULT_ITERS", "DEFAULT_WARMUP", "MAX_ITERS", "MAX_TIME_S", "MIN_ITERS", "PRECISION",
           "PROGRESS_EVERY_S", "WARMUP_SHARE",
           "TimingSettings", "device_sync", "latency_stats", "percentile", "time_calls", "time_interleaved",
           "time_rounds"]
