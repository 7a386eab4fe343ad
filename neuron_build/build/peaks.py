"""The expected peak memory of a compile, from what the store recorded of earlier compiles."""

from __future__ import annotations

from dataclasses import dataclass

from neuron_build.store.contract import ArtifactStore


@dataclass(frozen=True)
class PeakEstimate:
    """The expected peak resident memory of a compile, in bytes, and where the figure comes from."""

    bytes: int
    source: str


def expected_peak(store: ArtifactStore, model: str, bucket_id: str, default_bytes: int) -> PeakEstimate:
    """The last recorded peak memory of a compile of ``model`` at ``bucket_id`` (any dtype and profile),
    else ``default_bytes``.

    Looks at the bucket's target records (their key's manifest ``metrics.peak_rss_bytes``) and failure
    records (``peak_rss_bytes``); the most recent one wins.
    """
    best: tuple[str, int, str] | None = None
    for rec in store.targets(model, bucket_id):
        man = store.manifest(rec.key)
        peak = man.metrics.peak_rss_bytes if man is not None else None
        if isinstance(peak, int) and peak > 0:
            cand = (str(man.created), peak, f"peak of {man.target} ({rec.key[:12]})")
            best = cand if best is None or cand[0] > best[0] else best
    for fail in store.failures(model, bucket_id):
        if fail.peak_rss_bytes > 0:
            cand = (fail.time, fail.peak_rss_bytes, f"peak of the failed compile of {fail.target}")
            best = cand if best is None or cand[0] > best[0] else best
    if best is None:
        return PeakEstimate(int(default_bytes), "default_compile_memory_gb")
    return PeakEstimate(best[1], best[2])


def expected_compile_time(store: ArtifactStore, model: str, bucket_id: str) -> float | None:
    """The last recorded compile wall time of ``model`` at ``bucket_id`` (any dtype and profile), seconds:
    the ``metrics.compile_time_s`` of the bucket's stored artifacts, else the ``compile_time_s`` of its
    failure records; the most recent one wins. None when nothing was recorded (an ETA then uses the mean
    of the targets that have one)."""
    best: tuple[str, float] | None = None
    for rec in store.targets(model, bucket_id):
        man = store.manifest(rec.key)
        t = man.metrics.compile_time_s if man is not None else None
        if isinstance(t, (int, float)) and t > 0 and (best is None or str(man.created) > best[0]):
            best = (str(man.created), float(t))
    for fail in store.failures(model, bucket_id):
        t = fail.compile_time_s
        if isinstance(t, (int, float)) and t > 0 and (best is None or fail.time > best[0]):
            best = (fail.time, float(t))
    return best[1] if best else None


__all__ = ["PeakEstimate", "expected_compile_time", "expected_peak"]
