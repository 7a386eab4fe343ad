"""Progress of a build that runs many compiles at once: N of M done, which targets run where, and an ETA
from recorded compile times.

Pure data and text (no terminal handling), so any display can render it: :func:`progress_line` is the plain
one-line rendering the Dask executor prints; a richer display takes the same :class:`BuildProgress`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BuildProgress:
    """A snapshot of a running build.

    Attributes:
        total: targets the build compiles (cached ones excluded).
        done: of those, how many finished (passed or failed).
        failed: of the finished, how many failed.
        running: target id -> where it runs now (a Dask worker address, or ``local``).
        eta_s: estimated seconds until every compile finished, None when no compile time is known.
    """

    total: int
    done: int
    failed: int = 0
    running: Mapping[str, str] = field(default_factory=dict)
    eta_s: float | None = None


def pace(finished: Sequence[tuple[float | None, float | None]]) -> float:
    """How fast this build compiles against the predictions: the median of real / expected compile seconds
    over ``finished`` (pairs of expected and real seconds; pairs with either unknown or not positive are
    skipped); 1.0 when none is left. A rebuild on a warm machine (or a busier one) runs every compile faster
    (slower) than its record: the ETA scales what is left by the same factor."""
    ratios = sorted(r / e for e, r in finished if e and r and e > 0 and r > 0)
    if not ratios:
        return 1.0
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def estimate_eta(pending: Sequence[float | None], running: Sequence[tuple[float | None, float]],
                 slots: int, speed: float = 1.0) -> float | None:
    """Seconds until the build ends on ``slots`` compile slots (worker threads).

    Args:
        pending: the expected compile time (seconds) of each target not started yet; None when unknown.
        running: (expected compile time or None, seconds it has run so far) of each running target.
        slots: compile slots of the cluster (the sum of its workers' threads); at least 1 is assumed.
        speed: every expected time is multiplied by it (:func:`pace` of the compiles finished so far).

    A target without a recorded time counts as the mean of the known ones; with none known, None. The compiles
    are laid out as the dispatcher runs them, longest first on the slot that frees first (the running ones'
    remaining times, never below zero, fill their slots first), and the ETA is when the last slot ends: three
    75 s compiles on 2 slots end after 150 s, not 112 s (the remaining work over the slots, which a build of
    few long compiles never reaches).
    """
    import heapq

    pending = [t * speed if t is not None else None for t in pending]
    running = [(t * speed if t is not None else None, ran) for t, ran in running]
    known = [t for t in pending if t is not None] + [t for t, _ in running if t is not None]
    if not known:
        return None
    mean = sum(known) / len(known)
    n = max(slots, 1)
    left_running = sorted((max((t if t is not None else mean) - ran, 0.0) for t, ran in running), reverse=True)
    loads = [0.0] * n
    for i, left in enumerate(left_running):  # more running than slots (a cluster that grew): share them
        loads[i % n] += left
    heapq.heapify(loads)
    for t in sorted((t if t is not None else mean for t in pending), reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + t)
    return max(loads)


def progress_line(p: BuildProgress, max_running: int = 4) -> str:
    """One line, e.g. ``3/10 done (1 failed) · running: minilm/b8-s32/fp32/o2 on tcp://10.0.0.5:40123, ...
    · ETA 1m05s``; at most ``max_running`` running targets are named (``+N more``)."""
    head = f"{p.done}/{p.total} done" + (f" ({p.failed} failed)" if p.failed else "")
    parts = [head]
    if p.running:
        items = sorted(p.running.items())
        named = ", ".join(f"{t} on {w}" for t, w in items[:max_running])
        more = f", +{len(items) - max_running} more" if len(items) > max_running else ""
        parts.append(f"running: {named}{more}")
    if p.eta_s is not None and p.done < p.total:
        parts.append(f"ETA {format_duration(p.eta_s)}")
    return " · ".join(parts)


def format_duration(seconds: float) -> str:
    """``42 s``, ``3m05s``, ``2h07m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


__all__ = ["BuildProgress", "estimate_eta", "format_duration", "pace", "progress_line"]
