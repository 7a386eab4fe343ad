"""The compile monitoring checklist, evaluated over the build ledger (:mod:`neuron_build.store.ledger`).

Each signal has a figure, a limit from ``[monitoring]`` (:class:`~neuron_build.project.config.MonitoringSettings`),
a verdict and the action its alert names. A signal whose figure needs a Neuron device this store has no
measurement of says "not measured here" (``ok`` None): never a guess and never a pass.

| signal | figure | passes when |
|---|---|---|
| ``compile_failure_rate`` | failed compile attempts / compile attempts in the window | <= ``max_failure_rate`` |
| ``compile_time_p95_s`` | nearest-rank p95 of the passing compiles' wall time, seconds | <= ``max_compile_time_p95_s`` |
| ``recompiles_per_hour`` | most recompiles (compiles of a target whose key changed) within any 60 minutes | <= ``max_recompiles_per_hour`` |
| ``artifacts_per_model`` | most passing artifacts (buckets of the current matrix) of one model, dtype, profile and backend | <= ``max_artifacts_per_model`` |
| ``hbm_peak_fraction`` | peak HBM the compiler log estimates / one NeuronCore's HBM | <= ``max_hbm_fraction`` |
| ``p99_latency_ratio`` | worst p99 of a target's current artifact over its previous one's, same device kind | <= ``max_p99_ratio`` |
| ``neuroncore_utilisation`` | needs a profile on a Neuron device: always "not measured here" | >= ``min_neuroncore_utilisation`` |

Reads only the store: no project models, no torch.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from neuron_build.project.config import MonitoringSettings
from neuron_build.store.contract import RecordStore
from neuron_build.store.ledger import LedgerRecord
from neuron_build.util import percentile

#: The version of ``report --json``.
SCHEMA = 1
NOT_MEASURED = "not measured here"
#: signal -> the action its alert names (the checklist of the monitoring issue).
ACTIONS = {
    "compile_failure_rate": "keep the compiler workdir, classify by failure stage (neuron-build failures); "
                            "do not just retry",
    "compile_time_p95_s": "check for shape drift and for changed optlevel / compiler args (neuron-build explain TARGET)",
    "recompiles_per_hour": "dynamic shapes have leaked in: check which key components changed",
    "artifacts_per_model": "the buckets have not converged: merge buckets",
    "hbm_peak_fraction": "next-token latency will jitter from fragmentation",
    "p99_latency_ratio": "roll back to the previous release and compare op counts",
    "neuroncore_utilisation": "kernels too small after fusion: consider a larger batch",
}
SIGNALS = tuple(ACTIONS)


@dataclass
class Signal:
    """One checklist row: ``value`` (None when not measured), ``limit``, ``ok`` (None when not measured or no
    data), the ``action``, a one-line ``detail`` and the ``figures`` behind the value. ``kind`` is ``max``
    (passes at or below the limit) or ``min`` (at or above)."""

    name: str
    value: float | None
    limit: float
    unit: str
    detail: str
    action: str
    figures: dict[str, Any] = field(default_factory=dict)
    kind: str = "max"

    @property
    def ok(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit if self.kind == "max" else self.value >= self.limit

    @property
    def verdict(self) -> str:
        """``ok``, ``ALERT``, ``not measured here`` or ``no data``."""
        if self.value is None:
            return NOT_MEASURED if self.figures.get("needs_device") else "no data"
        return "ok" if self.ok else "ALERT"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "limit": float(self.limit), "ok": self.ok, "verdict": self.verdict,
                "unit": self.unit, "action": self.action, "detail": self.detail, "figures": self.figures}


@dataclass
class Report:
    """The checklist over a window, and the per-target figures (see :func:`evaluate`)."""

    since: _dt.datetime | None
    until: _dt.datetime
    records: list[LedgerRecord]
    signals: list[Signal]
    targets: list[dict[str, Any]]
    failures_by_stage: dict[str, int]
    kept_failures: list[dict[str, Any]] = field(default_factory=list)
    location: str = ""
    unreadable_records: list[str] = field(default_factory=list)  # ledger records skipped (:func:`ledger.read`)

    def counts(self) -> dict[str, int]:
        recs = self.records
        return {"records": len(recs), "compiles": sum(r.is_compile for r in recs),
                "failed": sum(r.is_compile and not r.ok for r in recs),
                "cached": sum(r.event == "cached" for r in recs), "reused": sum(r.event == "reused" for r in recs),
                "graph_reused": sum(r.event == "graph-reused" for r in recs)}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "store": self.location,
                "since": self.since.isoformat() if self.since else None, "until": self.until.isoformat(),
                **self.counts(), "thresholds": [s.to_json() for s in self.signals],
                "failures_by_stage": dict(self.failures_by_stage), "targets": self.targets,
                "kept_failures": self.kept_failures}


def _rate(records: list[LedgerRecord], mon: MonitoringSettings) -> Signal:
    compiles = [r for r in records if r.is_compile]
    failed = [r for r in compiles if not r.ok]
    stages = Counter(r.failure_stage or "unknown" for r in failed)
    figures = {"compiles": len(compiles), "failed": len(failed), "by_stage": dict(sorted(stages.items())),
               "failing_targets": sorted({r.target for r in failed})}
    if not compiles:
        return Signal("compile_failure_rate", None, mon.max_failure_rate, "ratio", "no compiles in the window",
                      ACTIONS["compile_failure_rate"], figures)
    value = round(len(failed) / len(compiles), 4)
    by = ", ".join(f"{k} {v}" for k, v in sorted(stages.items()))
    detail = f"{len(failed)} of {len(compiles)} compiles failed" + (f" (stage: {by})" if by else "")
    return Signal("compile_failure_rate", value, mon.max_failure_rate, "ratio", detail,
                  ACTIONS["compile_failure_rate"], figures)


def _p95(records: list[LedgerRecord], mon: MonitoringSettings) -> Signal:
    times = [(r.compile_time_s, r.target) for r in records if r.is_compile and r.ok and r.compile_time_s is not None]
    if not times:
        return Signal("compile_time_p95_s", None, mon.max_compile_time_p95_s, "seconds",
                      "no passing compiles in the window", ACTIONS["compile_time_p95_s"], {"compiles": 0})
    p95 = percentile([t for t, _ in times], 95, method="nearest-rank")
    slowest = max(times)
    return Signal("compile_time_p95_s", round(p95, 3), mon.max_compile_time_p95_s, "seconds",
                  f"p95 {p95:.1f} s over {len(times)} passing compiles; slowest {slowest[1]} {slowest[0]:.1f} s",
                  ACTIONS["compile_time_p95_s"], {"compiles": len(times), "slowest": slowest[1],
                                                  "slowest_s": slowest[0]})


def _recompiles(records: list[LedgerRecord], mon: MonitoringSettings) -> Signal:
    rec = [r for r in records if r.is_recompile and r.attempt <= 1]  # a transient retry is not another recompile
    times = sorted(r.when for r in rec)
    best, lo = 0, 0
    for hi in range(len(times)):
        while times[hi] - times[lo] > _dt.timedelta(hours=1):
            lo += 1
        best = max(best, hi - lo + 1)
    changed = Counter(c for r in rec for c in r.changed)
    targets = Counter(r.target for r in rec)
    figures = {"recompiles": len(rec), "changed": dict(sorted(changed.items())), "targets": dict(sorted(targets.items()))}
    top = ", ".join(f"{c} x{n}" for c, n in changed.most_common(3))
    detail = (f"{best} within one hour; {len(rec)} in the window" + (f"; changed: {top}" if top else ""))
    return Signal("recompiles_per_hour", float(best), mon.max_recompiles_per_hour, "per hour", detail,
                  ACTIONS["recompiles_per_hour"], figures)


def _artifacts(records: list[LedgerRecord], mon: MonitoringSettings, current: set[str] | None) -> Signal:
    latest: dict[str, LedgerRecord] = {}
    for r in records:
        if current is None or r.target in current:
            latest[r.target] = r
    groups: dict[str, set[str]] = {}
    for r in latest.values():
        if r.ok:
            groups.setdefault(r.group, set()).add(r.bucket)
    per = {g: len(b) for g, b in sorted(groups.items())}
    if not per:
        return Signal("artifacts_per_model", None, mon.max_artifacts_per_model, "artifacts",
                      "no passing artifacts in the window", ACTIONS["artifacts_per_model"], {"per_model": {}})
    worst = max(per.items(), key=lambda kv: (kv[1], kv[0]))
    return Signal("artifacts_per_model", float(worst[1]), mon.max_artifacts_per_model, "artifacts",
                  f"{worst[0]}: {worst[1]} buckets ({', '.join(sorted(groups[worst[0]]))})",
                  ACTIONS["artifacts_per_model"], {"per_model": per})


def _hbm(records: list[LedgerRecord], mon: MonitoringSettings) -> Signal:
    cap = mon.neuroncore_hbm_gb * 1e9
    seen = [(r.hbm_peak_bytes, r.target) for r in records if r.hbm_peak_bytes is not None]
    if not seen:
        return Signal("hbm_peak_fraction", None, mon.max_hbm_fraction, "ratio",
                      f"{NOT_MEASURED}: no compile log in the window states a peak HBM figure; measure it on a "
                      f"Neuron device (neuron-monitor)", ACTIONS["hbm_peak_fraction"], {"needs_device": True})
    peak = max(seen)
    return Signal("hbm_peak_fraction", round(peak[0] / cap, 4), mon.max_hbm_fraction, "ratio",
                  f"{peak[1]}: compiler estimate {peak[0] / 1e9:.2f} GB of {mon.neuroncore_hbm_gb:g} GB per NeuronCore",
                  ACTIONS["hbm_peak_fraction"], {"peak_bytes": peak[0], "target": peak[1], "neuroncore_bytes": cap,
                                                 "source": "compiler log estimate"})


def _bench_p99(store: RecordStore, key: str) -> dict[str, float]:
    """device kind -> p99 ms of the newest benchmark of ``key`` on it."""
    out: dict[str, tuple[str, float]] = {}
    for name, r in store.results(key, "bench").items():
        try:
            p99 = float(r["latency_ms"]["p99"])
        except (KeyError, TypeError, ValueError):
            continue
        kind = str(r.get("device_kind") or name.split("--")[0])
        when = str(r.get("time") or r.get("created") or "")
        if kind not in out or when >= out[kind][0]:
            out[kind] = (when, p99)
    return {k: v for k, (_, v) in out.items()}


def _p99(records: list[LedgerRecord], mon: MonitoringSettings, store: RecordStore | None) -> Signal:
    keys: dict[str, list[str]] = {}
    for r in records:
        if r.ok:
            lst = keys.setdefault(r.target, [])
            if not lst or lst[-1] != r.key:
                lst.append(r.key)
    ratios: dict[str, dict[str, Any]] = {}
    for tid, ks in sorted(keys.items()):
        if store is None or len(ks) < 2:
            continue
        cur, prev = _bench_p99(store, ks[-1]), _bench_p99(store, ks[-2])
        for kind in sorted(set(cur) & set(prev)):
            if prev[kind] > 0:
                ratios[tid] = {"ratio": round(cur[kind] / prev[kind], 4), "device_kind": kind,
                               "p99_ms": cur[kind], "baseline_p99_ms": prev[kind], "key": ks[-1], "baseline_key": ks[-2]}
                break
    if not ratios:
        return Signal("p99_latency_ratio", None, mon.max_p99_ratio, "ratio",
                      f"{NOT_MEASURED}: no target has benchmarks of its current and previous artifact on one device "
                      f"kind (neuron-build bench on a device)", ACTIONS["p99_latency_ratio"], {"needs_device": True})
    worst = max(ratios.items(), key=lambda kv: kv[1]["ratio"])
    return Signal("p99_latency_ratio", worst[1]["ratio"], mon.max_p99_ratio, "ratio",
                  f"{worst[0]}: p99 {worst[1]['p99_ms']:.3f} ms vs {worst[1]['baseline_p99_ms']:.3f} ms "
                  f"({worst[1]['device_kind']})", ACTIONS["p99_latency_ratio"], {"per_target": ratios})


def _utilisation(mon: MonitoringSettings) -> Signal:
    return Signal("neuroncore_utilisation", None, mon.min_neuroncore_utilisation, "ratio",
                  f"{NOT_MEASURED}: NeuronCore utilisation needs a profile under normal load on a Neuron device "
                  f"(neuron-monitor / neuron-profile)", ACTIONS["neuroncore_utilisation"], {"needs_device": True},
                  kind="min")


def target_rows(records: list[LedgerRecord]) -> list[dict[str, Any]]:
    """Per target: its compiles over time (``builds``: time, status, compile time s, peak memory bytes,
    event), and the newest op count, artifact bytes and peak memory of a passing compile or hit."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault(r.target, {"target": r.target, "builds": [], "last_status": None, "op_count": None,
                                         "artifact_bytes": None, "peak_rss_bytes": None, "hbm_peak_bytes": None,
                                         "compiles": 0, "failures": 0, "cache_hits": 0})
        row["last_status"] = r.status
        if r.is_compile:
            row["compiles"] += 1
            row["failures"] += 0 if r.ok else 1
            row["builds"].append({"time": r.time, "status": r.status, "compile_time_s": r.compile_time_s,
                                  "peak_rss_bytes": r.peak_rss_bytes, "key": r.key[:12],
                                  "failure_stage": r.failure_stage})
        else:
            row["cache_hits"] += 1
        if r.ok:
            for k in ("op_count", "artifact_bytes"):
                if getattr(r, k) is not None:
                    row[k] = getattr(r, k)
        if r.is_compile and r.peak_rss_bytes is not None:
            row["peak_rss_bytes"] = r.peak_rss_bytes
        if r.hbm_peak_bytes is not None:
            row["hbm_peak_bytes"] = r.hbm_peak_bytes
    return [rows[k] for k in sorted(rows)]


def evaluate(records: list[LedgerRecord], mon: MonitoringSettings, store: RecordStore | None = None,
             since: _dt.datetime | None = None, until: _dt.datetime | None = None,
             current: set[str] | None = None) -> Report:
    """The checklist over ``records`` (the ledger of the window ``since``..``until``, oldest first).

    Args:
        records: from :func:`neuron_build.store.ledger.read`.
        mon: the thresholds.
        store: where benchmark results are read for the p99 signal (None: not measured).
        current: the target ids of the current matrix: the artifacts signal counts only these (a bucket
            that was removed from ``buckets.toml`` is no longer an artifact of the model); None: every target.
    """
    signals = [_rate(records, mon), _p95(records, mon), _recompiles(records, mon), _artifacts(records, mon, current),
               _hbm(records, mon), _p99(records, mon, store), _utilisation(mon)]
    stages = Counter(r.failure_stage or "unknown" for r in records if r.is_compile and not r.ok)
    return Report(since=since, until=until or _dt.datetime.now(_dt.timezone.utc), records=records, signals=signals,
                  targets=target_rows(records), failures_by_stage=dict(sorted(stages.items())))


def format_text(rep: Report) -> str:
    """The report as text: the checklist table, then one line per target."""
    c = rep.counts()
    since = rep.since.strftime("%Y-%m-%d %H:%M UTC") if rep.since else "the beginning"
    lines = [f"build ledger of {rep.location or 'the store'} since {since}: {c['compiles']} compiles "
             f"({c['failed']} failed), {c['cached']} cache hits, {c['reused']} reuses, "
             f"{c['graph_reused']} graph reuses", ""]
    rows = [("signal", "figure", "limit", "verdict", "action")]
    for s in rep.signals:
        fig = "-" if s.value is None else f"{s.value:g}"
        lim = f"{'>=' if s.kind == 'min' else '<='} {s.limit:g}"
        rows.append((s.name, fig, lim, s.verdict, s.action if s.ok is not True else ""))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append(("  ".join(r[i].ljust(w[i]) for i in range(4)) + ("  " + r[4] if r[4] else "")).rstrip())
    lines.append("")
    for s in rep.signals:
        lines.append(f"  {s.name}: {s.detail}")
    if rep.targets:
        lines += ["", "targets:"]
        for t in rep.targets:
            times = [b["compile_time_s"] for b in t["builds"] if b["compile_time_s"] is not None]
            hist = ", ".join(f"{x:.1f}" for x in times[-5:]) or "-"
            size = f"{t['artifact_bytes'] / 2**20:.2f} MiB" if t["artifact_bytes"] is not None else "-"
            peak = f"{t['peak_rss_bytes'] / 2**20:.0f} MiB" if t["peak_rss_bytes"] is not None else "-"
            lines.append(f"  {t['target']}: {t['last_status']}; compile s [{hist}]; op count "
                         f"{t['op_count'] if t['op_count'] is not None else '-'}; artifact {size}; peak memory {peak}")
    return "\n".join(lines)


__all__ = ["ACTIONS", "NOT_MEASURED", "SCHEMA", "SIGNALS", "Report", "Signal", "evaluate", "format_text", "target_rows"]
