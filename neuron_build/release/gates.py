"""Release gates over stored validation and benchmark results: the hook the release pipeline calls.

Result records live beside artifacts (:meth:`neuron_build.store.contract.ArtifactStore.put_result`), never in the key:

- ``results/<key>/validation/<device kind>.json``: ``{"verdict": "pass" | "fail" | "not_validated",
  "reason": str | None, "device_kind": str, "outputs": [{"name", "max_abs_error", "rel_l2_error",
  "cosine_similarity", "tolerance", "pass"}], ...}``
- ``results/<key>/bench/<device kind>--<host>.json``: ``{"device_kind": str, "host": str,
  "latency_ms": {"p50", "p90", "p99", "mean"}, "throughput_per_s": float, "iters": int, ...}``

Device kinds: ``cpu``, ``cuda``, ``neuron``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_build.store.contract import ArtifactStore


@dataclass(frozen=True)
class GateCheck:
    """One gate's verdict: ``passed``, the figures it was decided on, and a one-line message."""

    name: str
    passed: bool
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "message": self.message, "figures": self.figures}


def bench_result(store: ArtifactStore, key: str, device_kind: str) -> dict[str, Any] | None:
    """The newest benchmark of ``key`` on ``device_kind`` (any host), or None."""
    rows = [r for name, r in store.results(key, "bench").items() if name.split("--")[0] == device_kind]
    return max(rows, key=lambda r: r.get("time", "")) if rows else None


def validation_gate(store: ArtifactStore, keys: dict[str, str], device_kind: str) -> GateCheck:
    """Did every artifact pass validation on the device kind that will serve it?

    Args:
        keys: target id -> key.
        device_kind: ``cpu``, ``cuda`` or ``neuron``.
    """
    missing, failed, ok = [], [], []
    for tid, key in keys.items():
        r = store.result(key, "validation", device_kind)
        if r is None or r.get("verdict") == "not_validated":
            missing.append(tid)
        elif r.get("verdict") != "pass":
            failed.append(f"{tid} ({r.get('reason') or 'failed'})")
        else:
            ok.append(tid)
    if failed or missing:
        parts = ([f"failed: {', '.join(failed)}"] if failed else []) + (
            [f"not validated on {device_kind}: {', '.join(missing)}"] if missing else [])
        return GateCheck("validated", False, "; ".join(parts),
                         {"passed": len(ok), "failed": len(failed), "not_validated": len(missing)})
    return GateCheck("validated", True, f"{len(ok)} artifact(s) passed validation on {device_kind}",
                     {"passed": len(ok)})


def latency_gate(store: ArtifactStore, keys: dict[str, str], baseline: dict[str, str] | None, device_kind: str,
                 max_ratio: float = 1.3) -> GateCheck:
    """Is each artifact's p99 latency within ``max_ratio`` times the baseline's for the same target?

    Args:
        keys: target id -> key of the candidate release.
        baseline: target id -> key of the release now in the channel (None: nothing to compare with).
        max_ratio: the largest allowed candidate p99 / baseline p99.

    Targets without a baseline or without benchmarks on both sides are listed in the figures and do not
    fail the gate.
    """
    if not baseline:
        return GateCheck("p99_latency", True, "no baseline release to compare with", {})
    ratios: dict[str, float] = {}
    skipped: list[str] = []
    for tid, key in keys.items():
        base_key = baseline.get(tid)
        cand = bench_result(store, key, device_kind)
        base = bench_result(store, base_key, device_kind) if base_key else None
        if not cand or not base:
            skipped.append(tid)
            continue
        ratios[tid] = round(cand["latency_ms"]["p99"] / base["latency_ms"]["p99"], 3)
    worst = max(ratios.items(), key=lambda kv: kv[1]) if ratios else None
    figures = {"ratios": ratios, "max_ratio": max_ratio, "not_compared": skipped}
    if worst and worst[1] > max_ratio:
        return GateCheck("p99_latency", False, f"{worst[0]} p99 is {worst[1]:.2f}x the baseline's "
                         f"(allowed {max_ratio:.2f}x)", figures)
    msg = (f"worst p99 ratio {worst[1]:.2f}x ({worst[0]}), allowed {max_ratio:.2f}x" if worst
           else "no benchmarks to compare")
    return GateCheck("p99_latency", True, msg, figures)


__all__ = ["GateCheck", "validation_gate", "latency_gate", "bench_result"]
