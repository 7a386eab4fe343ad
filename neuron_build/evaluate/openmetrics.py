"""``neuron-build metrics``: the report's figures as OpenMetrics text, through ``prometheus_client`` (its own
registry, ``prometheus_client.openmetrics.exposition.generate_latest``), for a node-exporter textfile
collector or a push gateway. Every figure is a gauge over the report's window; a signal that is not
measured here has no ``neuron_build_signal_value`` sample (never a guess) and ``neuron_build_signal_measured 0``.

Metric families (labels in braces), names as exposed:

- ``neuron_build_report_window_seconds``: the window's length (0: the whole ledger).
- ``neuron_build_compiles{status}``: compile attempts in the window by status (PASS, ERROR, ...).
- ``neuron_build_cache_lookups{event}``: cache hits (``cached``), reuses of another builder's compile (``reused``)
  and graph reuses (``graph-reused``: the source key missed, an artifact of the same graph was reused).
- ``neuron_build_compile_failures{target,stage}``: failed compile attempts by target and failure stage.
- ``neuron_build_signal_value{signal}``: each measured checklist figure (ratios as fractions, seconds, counts).
- ``neuron_build_signal_limit{signal}``: its threshold from ``[monitoring]``.
- ``neuron_build_signal_ok{signal}``: 1 when within the threshold, 0 on an alert (absent when not measured).
- ``neuron_build_signal_measured{signal}``: 1 when the figure was measured, 0 when it needs a device or data.
- ``neuron_build_target_compile_time_seconds{target}``: the newest compile's wall time.
- ``neuron_build_target_op_count{target}``, ``neuron_build_target_artifact_bytes{target}``,
  ``neuron_build_target_peak_rss_bytes{target}``: the newest figures of the target.
- ``neuron_build_artifacts{model,dtype,profile,backend}``: passing artifacts (buckets) per model group.
- ``neuron_build_kept_failure_workdirs``, ``neuron_build_kept_failure_workdir_bytes``: what the store keeps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from neuron_build.evaluate.monitoring import Report


def openmetrics_text(rep: Report, window_s: float = 0.0) -> bytes:
    """The OpenMetrics exposition (UTF-8 bytes, ending in ``# EOF``) of ``rep``.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
    """
    from prometheus_client import CollectorRegistry, Gauge
    from prometheus_client.openmetrics.exposition import generate_latest

    reg = CollectorRegistry(auto_describe=True)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        return Gauge(name, doc, labels, registry=reg)

    gauge("neuron_build_report_window_seconds", "length of the report window (0: the whole ledger)").set(window_s)
    compiles = gauge("neuron_build_compiles", "compile attempts in the window by status", ("status",))
    for status, n in sorted(Counter(r.status for r in rep.records if r.is_compile).items()):
        compiles.labels(status).set(n)
    lookups = gauge("neuron_build_cache_lookups", "cache hits (cached), reuses (reused) and graph reuses "
                    "(graph-reused: source changed, graph unchanged) in the window", ("event",))
    for event in ("cached", "reused", "graph-reused"):
        lookups.labels(event).set(sum(r.event == event for r in rep.records))
    fails = gauge("neuron_build_compile_failures", "failed compile attempts by target and failure stage",
                  ("target", "stage"))
    for (tid, stage), n in sorted(Counter((r.target, r.failure_stage or "unknown") for r in rep.records
                                          if r.is_compile and not r.ok).items()):
        fails.labels(tid, stage).set(n)
    value = gauge("neuron_build_signal_value", "checklist figure (see neuron-build report)", ("signal",))
    limit = gauge("neuron_build_signal_limit", "checklist threshold from [monitoring]", ("signal",))
    ok = gauge("neuron_build_signal_ok", "1 within the threshold, 0 on an alert", ("signal",))
    measured = gauge("neuron_build_signal_measured", "1 when the figure was measured here", ("signal",))
    for s in rep.signals:
        limit.labels(s.name).set(s.limit)
        measured.labels(s.name).set(0 if s.value is None else 1)
        if s.value is not None:
            value.labels(s.name).set(s.value)
            ok.labels(s.name).set(1 if s.ok else 0)
    per = {
        "compile_time_seconds": ("neuron_build_target_compile_time_seconds", "wall time of the newest compile"),
        "op_count": ("neuron_build_target_op_count", "op count of the newest passing artifact"),
        "artifact_bytes": ("neuron_build_target_artifact_bytes", "size of the newest passing artifact"),
        "peak_rss_bytes": ("neuron_build_target_peak_rss_bytes", "peak resident memory of the newest compile"),
    }
    gauges = {k: gauge(n, d, ("target",)) for k, (n, d) in per.items()}
    for t in rep.targets:
        times = [b["compile_time_s"] for b in t["builds"] if b["compile_time_s"] is not None]
        if times:
            gauges["compile_time_seconds"].labels(t["target"]).set(times[-1])
        for k in ("op_count", "artifact_bytes", "peak_rss_bytes"):
            if t[k] is not None:
                gauges[k].labels(t["target"]).set(t[k])
    arts = gauge("neuron_build_artifacts", "passing artifacts (buckets) per model, dtype, profile and backend",
                 ("model", "dtype", "profile", "backend"))
    art_sig = next((s for s in rep.signals if s.name == "artifacts_per_model"), None)
    for group, n in (art_sig.figures.get("per_model", {}) if art_sig else {}).items():
        arts.labels(*(group.split("/") + ["", "", "", ""])[:4]).set(n)
    gauge("neuron_build_kept_failure_workdirs", "failure workdirs the store keeps").set(len(rep.kept_failures))
    gauge("neuron_build_kept_failure_workdir_bytes", "bytes of the kept failure workdirs").set(
        sum(k.get("bytes", 0) for k in rep.kept_failures))
    return generate_latest(reg)


__all__ = ["openmetrics_text"]
