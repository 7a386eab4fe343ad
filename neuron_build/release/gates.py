"""The nine promotion gates, evaluated in :data:`GATES` order: channel order, validation, artifact count, op
count, latency, compile-time p95, the serving toolchain, for compile-cache and torchneuron releases the
fresh-process warm-up (:mod:`neuron_build.release.warmup`), and ``fresh``: is every artifact what a build from
today's source and environment makes (its graph captured again, :mod:`neuron_build.build.graph.fresh`, which the
caller runs and hands in: this layer does not build)?

The validation and latency gates read stored results; result records live beside artifacts
(:meth:`neuron_build.store.contract.ArtifactStore.put_result`), never in the key:

- ``results/<key>/validation/<device kind>.json``: ``{"verdict": "pass" | "fail" | "not_validated",
  "reason": str | None, "device_kind": str, "outputs": [{"name", "max_abs_error", "rel_l2_error",
  "cosine_similarity", "tolerance", "pass"}], ...}``
- ``results/<key>/bench/<device kind>--<host>.json``: ``{"format": 2, "device_kind": str, "host": str,
  "host_class": str, "session": str, "settings": {"threads", "timing", "warmup", "sync"}, "time": str,
  "latency_ms": {"p50", "p90", "p99", "mean", ...}, "median_ci_ms": [low, high], "samples_ms": [float],
  "throughput_per_s": float, "iters": int, ...}`` (:class:`neuron_build.evaluate.bench.BenchResult`, which the latency gate reads)

A gate's verdict is one word of :class:`neuron_build.status.Verdict`: ``pass``, ``fail`` or ``waived`` (a
failed gate let through by ``promote --waive GATE --reason TEXT``, recorded in the channel's history).

Device kinds: ``cpu``, ``cuda``, ``neuron``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from neuron_build.evaluate.bench import BenchResult
from neuron_build.project.config import ReleaseSettings
from neuron_build.release.records import Release, get_pointer, results_speak_for
from neuron_build.status import Verdict
from neuron_build.store.contract import ArtifactStore, RecordStore, ReleaseStore
from neuron_build.util import percentile, ratio_ci

R = TypeVar("R", BenchResult, dict)

#: The order in which promotion gates are evaluated and reported.
GATES = ("channel_order", "validated", "artifact_count", "op_count", "latency", "compile_time_p95",
         "serving_toolchain", "warmup", "fresh")

#: A fresh-capture check: the release -> the report of :func:`neuron_build.build.graph.fresh.fresh_check` as JSON
#: (``{"targets": [{"target", "verdict", "component", "reason", ...}], "probes", "counts", "clean"}``).
FreshCheck = Callable[[Release], dict[str, Any]]


@dataclass(frozen=True)
class GateCheck:
    """One gate's verdict: ``passed``, the figures it was decided on, and a one-line message.

    ``waived``: the gate failed and was let through with a recorded reason (``passed`` is then True).
    """

    name: str
    passed: bool
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    waived: bool = False

    @property
    def verdict(self) -> Verdict:
        """``pass``, ``fail`` or ``waived``."""
        return Verdict.WAIVED if self.waived else Verdict.of(self.passed)

    def to_json(self) -> dict[str, Any]:
        """``{"name", "verdict", "passed", "message", "figures"}``, as promotions record it in the history."""
        return {"name": self.name, "verdict": str(self.verdict), "passed": self.passed, "message": self.message,
                "figures": self.figures}


def bench_results(store: RecordStore, key: str, device_kind: str) -> list[dict[str, Any]]:
    """Every stored benchmark of ``key`` on ``device_kind`` (one per host), newest first, as stored."""
    rows = [r for name, r in store.results(key, "bench").items() if name.split("--")[0] == device_kind]
    return sorted(rows, key=lambda r: r.get("time", ""), reverse=True)


def bench_result(store: RecordStore, key: str, device_kind: str) -> dict[str, Any] | None:
    """The newest benchmark of ``key`` on ``device_kind`` (any host), as stored, or None."""
    rows = bench_results(store, key, device_kind)
    return rows[0] if rows else None


def bench_records(store: RecordStore, key: str, device_kind: str) -> list[BenchResult]:
    """:func:`bench_results` as :class:`~neuron_build.evaluate.bench.BenchResult`, newest first."""
    return [BenchResult.from_json(r) for r in bench_results(store, key, device_kind)]


def _typed(r: BenchResult | dict[str, Any]) -> BenchResult:
    return r if isinstance(r, BenchResult) else BenchResult.from_json(r)


def comparable(a: BenchResult | dict[str, Any], b: BenchResult | dict[str, Any]) -> str | None:
    """Why two benchmark records cannot be compared (None: they can): both must keep their samples
    (format 2), and have the same device kind, host class and settings (threads, timing, warm-up, sync)."""
    ta, tb = _typed(a), _typed(b)
    for r in (ta, tb):
        if not r.samples_ms:
            return f"the benchmark of {r.target} from {r.time} keeps no samples; run `neuron-build bench` again"
    for f in ("device_kind", "host_class", "settings"):
        if getattr(ta, f) != getattr(tb, f):
            return f"benchmarked with different {f.replace('_', ' ')}: {getattr(ta, f)} vs {getattr(tb, f)}"
    return None


def pick_pair(cands: Sequence[R], bases: Sequence[R]) -> tuple[R, R] | str:
    """The benchmarks to compare, newest first: a candidate and a baseline from the same session when
    there is one (timed together in rounds: the same host load), else the newest comparable pair.
    Records are :class:`~neuron_build.evaluate.bench.BenchResult` or their JSON; returns the pair (the
    records given), or why there is none."""
    if not cands or not bases:
        return "no benchmark of the " + ("candidate" if not cands else "baseline") + " on this device kind"
    for c in cands:
        for b in bases:
            sc, sb = _typed(c).session, _typed(b).session
            if sc and sc == sb and comparable(c, b) is None:
                return c, b
    why = ""
    for c in cands:
        for b in bases:
            why = comparable(c, b) or ""
            if not why:
                return c, b
    return why


def latency_gate(store: RecordStore, keys: dict[str, str], baseline: dict[str, str] | None, device_kind: str,
                 max_ratio: float = 1.3, confidence: float = 0.95,
                 unjudged: dict[str, str] | None = None) -> GateCheck:
    """Is each bucket's median latency at most ``max_ratio`` times the baseline's, beyond reasonable doubt?

    Per bucket: the candidate's and the baseline's benchmarks on ``device_kind`` (:func:`pick_pair`: the
    same session when possible, else the same host class and settings), the ratio of their median
    latencies and its confidence interval at ``confidence`` (:func:`neuron_build.util.ratio_ci`:
    distribution-free, from order statistics). The gate refuses only when the interval's lower bound
    exceeds ``max_ratio``: a slowdown measured as certain, not the noise of a busy host. The median, not
    p99: on a shared host p99 is set by other processes (seen 10-25x p50 on 2 cores).

    Args:
        keys: bucket id -> key of the candidate release.
        baseline: bucket id -> key of the release now in the channel (None: nothing to compare with).
        max_ratio: the largest allowed candidate / baseline median latency.
        unjudged: bucket id -> why the stored benchmarks under a side's key are of another artifact than the
            release pins (:func:`pinned_unjudged`): not compared.

    Buckets without comparable benchmarks on both sides are listed in ``not_compared`` with why, and do
    not fail the gate.
    """
    if not baseline:
        return GateCheck("latency", True, "no baseline release to compare with", {"max_ratio": max_ratio})
    rows: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for b, key in keys.items():
        base_key = baseline.get(b)
        if b in (unjudged or {}):
            skipped[b] = (unjudged or {})[b]
            continue
        if not base_key:
            skipped[b] = "the baseline release has no such bucket"
            continue
        pair = pick_pair(bench_records(store, key, device_kind), bench_records(store, base_key, device_kind))
        if isinstance(pair, str):
            skipped[b] = pair
            continue
        c, base = pair
        r, lo, hi = ratio_ci(c.samples_ms, base.samples_ms, confidence)
        rows[b] = {"ratio": round(r, 4), "ratio_low": round(lo, 4), "ratio_high": round(hi, 4),
                   "candidate_median_ms": c.median_ms, "baseline_median_ms": base.median_ms,
                   "candidate_samples": len(c.samples_ms), "baseline_samples": len(base.samples_ms),
                   "same_session": c.session == base.session, "host_class": c.host_class}
    figures = {"buckets": rows, "max_ratio": max_ratio, "confidence": confidence, "statistic": "median",
               "not_compared": skipped}
    worst = max(rows.items(), key=lambda kv: kv[1]["ratio_low"]) if rows else None
    if worst and worst[1]["ratio_low"] > max_ratio:
        b, w = worst
        return GateCheck("latency", False, f"{b} median latency is {w['ratio']:.2f}x the baseline's "
                         f"({confidence:.0%} interval {w['ratio_low']:.2f}-{w['ratio_high']:.2f}x; allowed "
                         f"{max_ratio:.2f}x)", figures)
    if not worst:
        return GateCheck("latency", True, "no comparable benchmarks"
                         + (f" ({'; '.join(f'{b}: {w}' for b, w in skipped.items())})" if skipped else ""), figures)
    top = max(rows.items(), key=lambda kv: kv[1]["ratio"])
    return GateCheck("latency", True, f"worst median ratio {top[1]['ratio']:.2f}x ({top[0]}, {confidence:.0%} "
                     f"interval {top[1]['ratio_low']:.2f}-{top[1]['ratio_high']:.2f}x), allowed {max_ratio:.2f}x",
                     figures)


def validation_gate(store: RecordStore, keys: dict[str, str], device_kind: str,
                    release: Release | None = None) -> GateCheck:
    """Did every artifact pass validation on the device kind that will serve it?

    Args:
        keys: target id -> key.
        device_kind: ``cpu``, ``cuda`` or ``neuron``.
        release: the release promoted: a bucket whose pinned files are not the files of the manifest its
            result judged (an older release of a key rebuilt since, :func:`results_speak_for`) is not
            validated, whatever the result says.
    """
    missing, failed, ok, other = [], [], [], []
    arts = {a.target: a for a in release.artifacts} if release is not None else {}
    for tid, key in keys.items():
        r = store.result(key, "validation", device_kind)
        why = results_speak_for(store, arts[tid]) if tid in arts and r is not None else None  # type: ignore[arg-type]
        if why:
            other.append(f"{tid} ({why})")
        elif r is None or r.get("verdict") == Verdict.NOT_VALIDATED:
            missing.append(tid)
        elif r.get("verdict") == Verdict.ERROR:  # the check did not reach a verdict: not validated, not failed
            missing.append(f"{tid} (the last validation ended in an error; run it again)")
        elif r.get("verdict") != Verdict.PASS:
            failed.append(f"{tid} ({r.get('reason') or 'failed'})")
        else:
            ok.append(tid)
    if failed or missing or other:
        parts = ([f"failed: {', '.join(failed)}"] if failed else []) + (
            [f"not validated on {device_kind}: {', '.join(missing)}"] if missing else []) + (
            [f"the release's files are not the ones validated: {', '.join(other)}; run `neuron-build validate`, "
             f"then make a new release (`neuron-build release`)"] if other else [])
        return GateCheck("validated", False, "; ".join(parts),
                         {"passed": len(ok), "failed": len(failed), "not_validated": len(missing) + len(other)})
    return GateCheck("validated", True, f"{len(ok)} artifact(s) passed validation on {device_kind}",
                     {"passed": len(ok)})


def order_gate(settings: ReleaseSettings, store: ReleaseStore, model: str, to: str, from_channel: str | None,
               release: str) -> GateCheck:
    """Is the promotion in channel order? Into the first channel: from a release id. Into channel ``i``:
    ``--from`` channel ``i - 1``, or the release id that channel ``i - 1`` holds now. ``allow_skip``
    also allows any earlier channel, or any release id."""
    chans = list(settings.channels)
    i = chans.index(to)
    required = chans[i - 1] if i > 0 else "a release id"
    figures = {"to": to, "from": from_channel or release, "required_from": required,
               "allow_skip": settings.allow_skip}
    if from_channel is not None:
        j = chans.index(from_channel)
        ok = j == i - 1 or (settings.allow_skip and j < i)
        if ok:
            return GateCheck("channel_order", True, f"{from_channel} -> {to}", figures)
        return GateCheck("channel_order", False, f"{to} takes releases from {required}, not from "
                         f"{from_channel}" + ("" if settings.allow_skip else " (allow_skip = false)"), figures)
    if i == 0 or settings.allow_skip:
        return GateCheck("channel_order", True, f"release {release} -> {to}", figures)
    prev = get_pointer(store, model, chans[i - 1])
    if prev and prev.release == release:
        return GateCheck("channel_order", True, f"release {release} is the one in {chans[i - 1]}", figures)
    return GateCheck("channel_order", False, f"{to} takes releases from {required}; release {release} is not the "
                     f"one {required} holds ({prev.release if prev else 'none'}); promote it with "
                     f"--from {required}", figures)


def artifact_count_gate(release: Release, max_artifacts: int) -> GateCheck:
    """At most ``max_artifacts`` artifacts (buckets) in the release."""
    n = len(release.artifacts)
    figures = {"artifacts": n, "max": max_artifacts}
    if n > max_artifacts:
        return GateCheck("artifact_count", False, f"{n} artifacts, more than max_artifacts_per_model = "
                         f"{max_artifacts}", figures)
    return GateCheck("artifact_count", True, f"{n} artifact(s), at most {max_artifacts}", figures)


def pinned_unjudged(store: ArtifactStore, *releases: Release | None) -> dict[str, str]:
    """Bucket id -> why the stored results under its key do not speak for the files ``releases`` pin
    (:func:`neuron_build.release.records.results_speak_for`: the key's artifact rebuilt since), for each bucket of
    each release given (None skipped) where they do not; the first release's reason wins."""
    out: dict[str, str] = {}
    for rel in releases:
        for a in rel.artifacts if rel is not None else ():
            why = results_speak_for(store, a)
            if why and a.bucket_id not in out:
                out[a.bucket_id] = f"the benchmarks under the key of release {rel.id} are not of its files: {why}"
    return out


def _by_bucket(release: Release | None) -> dict[str, dict[str, Any]]:
    """Bucket id -> ``{"key", **the bucket's metrics}`` of a release ({} for None)."""
    if not release:
        return {}
    metrics = release.metrics.get("artifacts", {})
    return {a.bucket_id: {"key": a.key, **metrics.get(a.target, {})} for a in release.artifacts}


def op_count_gate(release: Release, baseline: Release | None, max_regression: float) -> GateCheck:
    """Is each bucket's op count at most ``max_regression`` (a fraction) above the same bucket's in the
    baseline release? Buckets are matched by bucket id, so a new dtype is compared with the old one."""
    if not baseline:
        return GateCheck("op_count", True, "no baseline release to compare with", {"max_regression": max_regression})
    cand, base = _by_bucket(release), _by_bucket(baseline)
    rows: dict[str, dict[str, Any]] = {}
    skipped = []
    for b, c in cand.items():
        old = base.get(b, {}).get("op_count")
        new = c.get("op_count")
        if not old or new is None:
            skipped.append(b)
            continue
        rows[b] = {"baseline": old, "candidate": new, "change": round(new / old - 1, 4)}
    figures = {"buckets": rows, "max_regression": max_regression, "not_compared": skipped}
    worst = max(rows.items(), key=lambda kv: kv[1]["change"]) if rows else None
    if worst and worst[1]["change"] > max_regression:
        b, r = worst
        return GateCheck("op_count", False, f"{b} op count {r['candidate']} is {r['change']:.1%} above the "
                         f"baseline's {r['baseline']} (allowed {max_regression:.1%})", figures)
    msg = (f"worst change {worst[1]['change']:+.1%} ({worst[0]}), allowed +{max_regression:.1%}" if worst
           else "no op counts to compare")
    return GateCheck("op_count", True, msg, figures)


def compile_time_gate(release: Release, max_p95_s: float) -> GateCheck:
    """Is the nearest-rank p95 of the release's compile times (seconds) at most ``max_p95_s``?"""
    times = {t: m["compile_time_s"] for t, m in release.metrics["artifacts"].items()}
    p95 = percentile(times.values(), 95, method="nearest-rank")
    figures = {"p95_s": p95, "max_p95_s": max_p95_s, "compile_times_s": times}
    if p95 > max_p95_s:
        return GateCheck("compile_time_p95", False, f"compile-time p95 {p95:.1f} s is above "
                         f"max_compile_time_p95_s = {max_p95_s:g} s", figures)
    return GateCheck("compile_time_p95", True, f"compile-time p95 {p95:.1f} s, at most {max_p95_s:g} s", figures)


def serving_toolchain_gate(release: Release, settings: ReleaseSettings, channel: str) -> GateCheck:
    """Was the release built with the versions the channel's serving hosts run (``[release] serving`` and
    ``channel_serving``)? Each declared package the release was built with must satisfy the declared
    specifier; packages the release was not built with (torch-neuronx for an inductor release) do not
    count. A channel that declares nothing passes."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    declared = settings.serving_for(channel)
    figures = {"declared": declared, "built_with": {p: release.toolchain.get(p) for p in declared}}
    if not declared:
        return GateCheck("serving_toolchain", True, f"no serving toolchain declared for channel '{channel}'",
                         figures)
    bad = []
    for pkg, spec in declared.items():
        built = release.toolchain.get(pkg)
        if not built:
            continue
        try:
            ok = SpecifierSet(spec).contains(Version(str(built)), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            bad.append(f"built with {pkg} {built}, but channel '{channel}' serves {pkg}{spec}")
    if bad:
        return GateCheck("serving_toolchain", False, "; ".join(bad) + " ([release] serving / channel_serving)",
                         figures)
    shown = ", ".join(f"{p} {release.toolchain.get(p)}" for p in declared if release.toolchain.get(p))
    return GateCheck("serving_toolchain", True, f"built with {shown or 'none of the declared packages'}, "
                     f"as channel '{channel}' serves", figures)


#: Gates ``promote --waive`` may let through (channel order is the pipeline's shape: see ``allow_skip``).
WAIVABLE = tuple(g for g in GATES if g != "channel_order")


def waive(check: GateCheck, reason: str) -> GateCheck:
    """A failed gate let through: passed, verdict ``waived``, the reason in its message and figures."""
    return GateCheck(check.name, True, f"waived ({reason}): {check.message}",
                     {**check.figures, "waived": True, "waiver_reason": reason}, waived=True)


def warmup_gate(store: ArtifactStore, release: Release, device_kind: str, factory_root=None,
                allow_not_checked: bool = False) -> GateCheck:
    """Did a fresh-process warm-up of the pulled release compile nothing on ``device_kind``? Passes for
    releases of other backends (``applies: false``); "not checked" (no NeuronCore or CUDA device here) never
    passes unless ``allow_not_checked``. See :func:`neuron_build.release.warmup.warmup_verdict`."""
    from neuron_build.release.warmup import GATE, warmup_verdict

    passed, message, figures = warmup_verdict(store, release, device_kind, factory_root, allow_not_checked)
    return GateCheck(GATE, passed, message, figures)


def fresh_gate(release: Release, check: FreshCheck | None) -> GateCheck:
    """Is every artifact of the release what a build from today's source and environment makes? ``check``
    captures each target's graph again (one probe per model build, nothing compiled) and compares it with
    the artifact's graph key. Fails when an artifact differs (the component named) or a target could not be
    keyed; targets whose backend makes no graph key are listed as unverifiable (the gate still passes on
    them: nothing to compare). ``check`` None (a caller without a project to capture from): the gate passes
    marked ``checked: false`` (``neuron-build promote`` always checks)."""
    if check is None:
        return GateCheck("fresh", True, "not checked: no project to capture the graphs from (neuron-build promote "
                         "checks it)", {"checked": False})
    rep = check(release)
    rows = rep.get("targets") or []
    bad = [r for r in rows if r.get("verdict") in ("differs", "unchecked", "unbuilt")]
    unverifiable = [r["target"] for r in rows if r.get("verdict") == "unverifiable"]
    figures = {"checked": True, "counts": rep.get("counts"), "probes": rep.get("probes"),
               "not_fresh": [{k: r.get(k) for k in ("target", "verdict", "component", "reason")} for r in bad],
               "unverifiable": unverifiable}
    note = f"; unverifiable (no graph key): {', '.join(unverifiable)}" if unverifiable else ""
    if bad:
        shown = "; ".join(f"{r['target']} {r.get('component') or r.get('verdict')}: {r.get('reason')}" for r in bad)
        return GateCheck("fresh", False, f"{len(bad)} artifact(s) not what today's code builds: {shown}{note}",
                         figures)
    fresh = sum(1 for r in rows if r.get("verdict") == "fresh")
    return GateCheck("fresh", True, f"{fresh} artifact(s) match a fresh capture of their graph{note}", figures)


def evaluate_gates(store: ArtifactStore, settings: ReleaseSettings, release: Release, to: str,
                   from_channel: str | None, baseline: Release | None, device_kind: str,
                   allow_unvalidated: bool = False, waivers: dict[str, str] | None = None,
                   factory_root=None, fresh: FreshCheck | None = None) -> list[GateCheck]:
    """Every gate of a promotion of ``release`` into ``to``, run and returned in :data:`GATES` order (each
    name in ``GATES`` picks its gate function).

    Args:
        baseline: the release ``to`` holds now (None: the channel is empty).
        device_kind: where ``to`` is served: validation and latency results are read for it.
        allow_unvalidated: a failed validation gate passes, marked ``overridden`` in its figures; so does
            a warm-up that could not be checked on this host.
        waivers: gate name -> the reason it may fail (:data:`WAIVABLE`); a failed gate named here passes
            with verdict ``waived`` (:func:`waive`). A passing gate is not affected.
        factory_root: where a compile-cache release's model factory imports from (the project folder).
        fresh: the fresh-capture check of the ``fresh`` gate (:func:`fresh_gate`; None: not checked).
    """
    waivers = dict(waivers or {})
    cand_b = {b: v["key"] for b, v in _by_bucket(release).items()}
    base_b = {b: v["key"] for b, v in _by_bucket(baseline).items()} or None

    def validated() -> GateCheck:
        val = validation_gate(store, release.keys, device_kind, release)
        if not val.passed and allow_unvalidated:
            return GateCheck("validated", True, f"overridden by --allow-unvalidated ({val.message})",
                             {**val.figures, "overridden": True, "device_kind": device_kind}, waived=True)
        return GateCheck(val.name, val.passed, val.message, {**val.figures, "device_kind": device_kind})

    run: dict[str, Callable[[], GateCheck]] = {
        "channel_order": lambda: order_gate(settings, store, release.model, to, from_channel, release.id),
        "validated": validated,
        "artifact_count": lambda: artifact_count_gate(release, settings.max_artifacts_per_model),
        "op_count": lambda: op_count_gate(release, baseline, settings.max_op_count_regression),
        "latency": lambda: latency_gate(store, cand_b, base_b, device_kind, settings.max_latency_ratio,
                                        settings.latency_confidence, pinned_unjudged(store, release, baseline)),
        "compile_time_p95": lambda: compile_time_gate(release, settings.max_compile_time_p95_s),
        "serving_toolchain": lambda: serving_toolchain_gate(release, settings, to),
        "warmup": lambda: warmup_gate(store, release, device_kind, factory_root, allow_unvalidated),
        "fresh": lambda: fresh_gate(release, fresh),
    }
    checks = [run[name]() for name in GATES]
    return [waive(g, waivers[g.name]) if not g.passed and g.name in waivers else g for g in checks]


def format_gates(gates: Iterable[GateCheck | dict[str, Any]]) -> str:
    """One line per gate: ``PASS name: message`` (``FAIL``, ``WAIVED``); gates as :class:`GateCheck` or its
    JSON."""
    lines = []
    for g in gates:
        d = g.to_json() if isinstance(g, GateCheck) else g
        word = str(d.get("verdict") or Verdict.of(d["passed"])).upper()
        lines.append(f"  {word} {d['name']}: {d['message']}")
    return "\n".join(lines)
__all__ = [
    "GATES",
    "FreshCheck",
    "GateCheck",
    "fresh_gate",
    "artifact_count_gate",
    "WAIVABLE",
    "bench_records",
    "bench_result",
    "bench_results",
    "comparable",
    "pick_pair",
    "pinned_unjudged",
    "waive",
    "compile_time_gate",
    "evaluate_gates",
    "format_gates",
    "latency_gate",
    "op_count_gate",
    "order_gate",
    "serving_toolchain_gate",
    "validation_gate",
    "warmup_gate",
]
