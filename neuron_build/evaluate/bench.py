"""Latency benchmarks of compiled artifacts, with the eager model as the baseline, and their typed result.

A benchmark session (:func:`bench_targets`): load every selected target's artifact onto its device and
its eager model in the target dtype on the same device, make each target's deterministic inputs (the
validation inputs, :func:`neuron_build.evaluate.validate_setup.validation_seed`), then time them all together
in rounds (:func:`neuron_build.evaluate.timing.time_rounds`, with the session's
:class:`~neuron_build.evaluate.timing.TimingSettings`). Reported per target (:class:`BenchResult`): p50,
p90, p99 and mean latency in milliseconds (percentiles by linear interpolation between order
statistics), the median's distribution-free confidence interval (:func:`neuron_build.util.median_ci`),
every sample, throughput in samples per second (batch / mean latency; the batch is the first dim of the
first input), the speedup over eager (eager p50 / compiled p50), the session id, host class and settings
the latency gate compares. Stored as ``results/<key>/bench/<device kind>--<host>.json`` (schema in
:mod:`neuron_build.release.gates`). Profiler runs are :mod:`neuron_build.evaluate.profile`; the timers
:mod:`neuron_build.evaluate.timing` (their names are re-exported here for scripts).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.evaluate.profile import SCHEDULE, check_runnable, round_stats, run_dir_name
from neuron_build.evaluate.timing import (
    DEFAULT_ITERS,
    DEFAULT_WARMUP,
    TimingSettings,
    device_sync,
    latency_stats,
    time_calls,
    time_interleaved,
    time_rounds,
)
from neuron_build.evaluate.validate_run import prepare
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import median_ci, percentile, utc_now

#: Version of the benchmark record (2: samples, median interval, host class, settings, session).
BENCH_FORMAT = 2
#: Keys of a record that only some records have (left out of :meth:`BenchResult.to_json` when None).
_OPTIONAL = ("eager", "speedup_vs_eager", "textgen", "validation", "profile")


@dataclass(frozen=True)
class BenchResult:
    """One target's benchmark of one session, as stored under ``results/<key>/bench/<device kind>--<host>.json``.

    Latencies are milliseconds; ``latency_ms`` holds ``p50``, ``p90``, ``p99``, ``mean``, ``min``, ``max``,
    ``std``; ``median_ci_ms`` is ``[low, high]`` at ``confidence``; ``samples_ms`` every timed latency;
    ``throughput_per_s`` samples per second over the mean; ``settings`` what must be equal for two results
    to compare (``threads``, ``timing``, ``warmup``, ``sync``). ``eager`` and ``speedup_vs_eager`` (eager p50
    / compiled p50) when the eager model was timed; ``textgen`` for a prefill or decode graph (``graph``,
    ``p50_ms``, ``p99_ms``, and ``ttft_ms`` or ``tokens_per_s``); ``validation`` and ``profile`` when
    ``bench --compare`` / ``--profile`` added them (never stored).

    Records in stores are untrusted and may come from older versions: :meth:`from_json` accepts any
    mapping, a missing field reads as None (or empty), unknown keys are kept in ``extra``, and
    :meth:`to_json` gives back the same dict, key order included.
    """

    format: int | None = None
    target: str | None = None
    key: str | None = None
    model: str | None = None
    dtype: str | None = None
    backend: str | None = None
    device_kind: str | None = None
    device: str | None = None
    host: str | None = None
    host_class: str | None = None
    time: str | None = None
    session: str | None = None
    iters: int | None = None
    warmup: int | None = None
    stopped_by: str | None = None
    settings: dict[str, Any] | None = None
    batch: int | None = None
    seed: int | None = None
    sync: str | None = None
    timing: str | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    median_ci_ms: list[float] | None = None
    confidence: float | None = None
    throughput_per_s: float | None = None
    op_count: int | None = None
    compile_time_s: float | None = None
    torch: str | None = None
    threads: int | None = None
    cpu_count: int | None = None
    load_avg_1m: float | None = None
    eager: dict[str, Any] | None = None
    speedup_vs_eager: float | None = None
    textgen: dict[str, Any] | None = None
    samples_ms: list[float] = field(default_factory=list)
    validation: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    #: keys of the stored record this class has no field for
    extra: dict[str, Any] = field(default_factory=dict)
    #: the stored record's keys in their order (empty: a new record, fields in declaration order)
    order: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def median_ms(self) -> float | None:
        """The median latency (ms), or None when the record has none."""
        return self.latency_ms.get("p50")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BenchResult:
        """A stored record (any version) as a :class:`BenchResult`; never raises for missing keys."""
        names = _field_names()
        known = {n: d[n] for n in names if n in d}
        return cls(**known, extra={k: v for k, v in d.items() if k not in known}, order=tuple(d))

    def to_json(self) -> dict[str, Any]:
        """The record as stored and printed by ``bench --json``. A record read with :meth:`from_json` gives
        back the same dict, key order included (plus fields set since, e.g. ``validation``); a new record
        has its fields in declaration order, the optional ones only when set, then ``extra``."""
        out: dict[str, Any] = {}
        if self.order:
            out = {k: getattr(self, k) if k in _field_names() else self.extra[k] for k in self.order}
            for f in dataclasses.fields(self):
                if f.name in _field_names() and f.name not in out and getattr(self, f.name) != _default(f):
                    out[f.name] = getattr(self, f.name)
            return out
        for n in _field_names():
            v = getattr(self, n)
            if not (n in _OPTIONAL and v is None):
                out[n] = v
        out.update(self.extra)
        return out

    def with_(self, **changes: Any) -> BenchResult:
        """A copy with ``changes`` (e.g. ``validation``) set."""
        return dataclasses.replace(self, **changes)


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(BenchResult) if f.name not in ("extra", "order")]


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def host_class(device_kind: str, device: str = "cpu") -> str:
    """What makes latencies of two hosts comparable: the machine, the processor model and the number of
    CPUs (``x86_64 AMD EPYC 7R13 Processor x2``), plus the GPU name on CUDA (``torch.cuda.get_device_name``)
    and the EC2 instance type on Neuron (``/sys/devices/virtual/dmi/id/product_name``, e.g. ``trn1.2xlarge``
    [guess: verify on a Neuron host]). Never the host name: CI runners of one class compare."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = f"{platform.machine()} {cpu or platform.processor() or 'cpu'} x{os.cpu_count()}"
    if device_kind == "cuda":
        import torch
        out += f" + {torch.cuda.get_device_name(device)}"
    elif device_kind == "neuron":
        try:
            out += " + " + Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
        except OSError:
            pass
    return out


def bench_targets(project, store: ArtifactStore, items: Sequence[tuple[Any, str]], timing: TimingSettings, *,
                  progress_factory: Callable | None = None, record: bool = True,
                  wrap: Callable[[Any, Callable], Callable] | None = None,
                  note: Callable[[str], None] | None = None) -> list[BenchResult]:
    """Benchmark several targets' artifacts (and their eager models) in one session and store the results.

    Every artifact and eager model is loaded first; then all are timed together in rounds
    (:func:`~neuron_build.evaluate.timing.time_rounds`): artifacts and eager models alike, so two targets
    benchmarked together (the fp32 and bf16 buckets of a model, a candidate and the release it replaces)
    saw the same host load and their ratio is meaningful. The records share a ``session`` id, which the
    latency gate prefers.

    Args:
        items: ``(target, key)`` pairs (the key may be another than the target's current one, e.g. the
            artifact of a release).
        timing: warm-up, fixed or adaptive rounds (the artifacts' medians decide, not the eager models'),
            confidence, threads and whether the eager models are timed. ``threads`` is recorded in
            ``settings``: results with other thread counts do not compare. On a shared 2-core host, 2
            threads put some processes into a mode where every call waits for a descheduled OpenMP thread
            (seen: 0.15 ms vs 100-250 ms per call of one artifact, changing from process to process); 1
            thread did not.
        progress_factory: ``f(total, desc)`` returning a progress bar (tqdm-like) or None.
        record: store each result under ``results/<key>/bench/<device kind>--<host>.json``.
        wrap: ``wrap(target, fn)`` returns the callable to time instead of the loaded artifact ``fn``
            (tests slow an artifact down with it).
        note: told what the timing will take and its progress, one line at a time
            (:func:`~neuron_build.evaluate.timing.time_rounds`).

    Returns:
        One :class:`BenchResult` per item, in order (``format`` :data:`BENCH_FORMAT`, ``host_class``
        :func:`host_class`, ``load_avg_1m`` when the session started).

    Raises:
        UserError: a target is not built, or this host cannot run its artifact; bad warmup/iters/threads.
    """
    import torch

    timing.check()
    if timing.threads is not None:
        torch.set_num_threads(timing.threads)
    load0 = os.getloadavg()[0]
    session = uuid.uuid4().hex[:16]
    preps = []
    for target, key in items:
        p = prepare(project, store, target, key)
        check_runnable(p)
        preps.append(p)
    fns, inputs, syncs, names, textgen = _load_items(project, store, items, preps, wrap)
    n_art = len(fns)
    eager = timing.eager
    if eager:
        for idx, ((target, _key), p, sync) in enumerate(zip(items, preps, syncs[:n_art], strict=True)):
            fns.append(textgen[idx][1] if idx in textgen else p.eager(target.dtype, device=p.device))
            inputs.append(textgen[idx][2] if idx in textgen else p.device_inputs())
            syncs.append(sync)
    desc = (f"{items[0][0].id}" if len(items) == 1 else f"{len(items)} targets") + (" + eager" if eager else "")
    iters = timing.iters
    bar = progress_factory(timing.warmup + iters if iters else None, desc) if progress_factory else None
    try:
        done = {"warmup": 0}  # the warm-up rounds run: the budget may cut them short
        times, stopped = time_rounds(fns, inputs, syncs, timing, decide=range(n_art), progress=bar, note=note,
                                     rounds=done)
    finally:
        if bar is not None:
            bar.close()
    host, now = socket.gethostname(), utc_now()
    recs = []
    for idx, ((target, key), p) in enumerate(zip(items, preps, strict=True)):
        rec = _result(target, key, p, times[idx], times[n_art + idx] if eager else None, timing,
                      host=host, now=now, session=session, stopped=stopped, sync_name=names[idx], warmup_done=done["warmup"],
                      load0=load0, textgen=idx in textgen)
        if record:
            store.put_result(key, "bench", f"{p.device_kind}--{host}", rec.to_json())
        recs.append(rec)
    return recs


def _load_items(project, store: ArtifactStore, items: Sequence[tuple[Any, str]], preps: list,
                wrap: Callable[[Any, Callable], Callable] | None):
    """Load what a session times of each item: (callables, inputs, device syncs, sync names, and item index ->
    ``(compiled, eager, inputs)`` of a text-generation graph, loaded as serving and validation load it:
    :func:`neuron_build.evaluate.textgen_validate.bench_callables`)."""
    fns: list[Callable] = []
    inputs: list[tuple] = []
    syncs: list[Callable[[], None]] = []
    names: list[str] = []
    textgen: dict[int, tuple] = {}  # item index -> (compiled, eager, inputs) of a prefill or decode graph
    for idx, ((target, key), p) in enumerate(zip(items, preps, strict=True)):
        sync, sync_name = device_sync(p.device_kind)
        if getattr(target, "graph", ""):
            from neuron_build.evaluate.textgen_validate import bench_callables

            textgen[idx] = bench_callables(project, store, target, key, p.manifest)
        fn = textgen[idx][0] if idx in textgen else p.load_artifact()
        fns.append(wrap(target, fn) if wrap else fn)
        inputs.append(textgen[idx][2] if idx in textgen else p.device_inputs())
        syncs.append(sync)
        names.append(sync_name)
    return fns, inputs, syncs, names, textgen


def _result(target, key: str, p, compiled_ms: list[float], eager_ms: list[float] | None, timing: TimingSettings,
            **session: Any) -> BenchResult:
    """The :class:`BenchResult` of one item of a session (``session``: host, now, session, stopped,
    sync_name, load0, textgen, warmup_done: the warm-up rounds run, which the record's ``warmup`` holds)."""
    import torch

    s = session
    stats = latency_stats(compiled_ms)
    _med, lo, hi = median_ci(compiled_ms, timing.confidence)
    m = p.manifest
    threads = torch.get_num_threads()
    eager = speedup = tg = None
    if eager_ms is not None:
        es = latency_stats(eager_ms)
        eager = {"latency_ms": round_stats(es), "throughput_per_s": round(p.batch * 1000.0 / es["mean"], 6),
                 "device": p.device, "dtype": target.dtype}
        speedup = round(es["p50"] / stats["p50"], 6)
    if s["textgen"]:  # prefill: time to first token; decode: per-token latency, tokens per second
        tg = {"graph": target.graph, "p50_ms": round(stats["p50"], 6), "p99_ms": round(stats["p99"], 6)}
        if target.graph == "prefill":
            tg["ttft_ms"] = tg["p50_ms"]
        else:
            tg["tokens_per_s"] = round(p.batch * 1000.0 / stats["p50"], 3)
    return BenchResult(
        format=BENCH_FORMAT, target=target.id, key=key, model=target.model, dtype=target.dtype,
        backend=m.backend, device_kind=p.device_kind, device=p.device, host=s["host"],
        host_class=host_class(p.device_kind, p.device), time=s["now"], session=s["session"],
        iters=len(compiled_ms), warmup=s.get("warmup_done", timing.warmup), stopped_by=s["stopped"],
        settings={"threads": threads, "timing": timing.timing, "warmup": timing.warmup, "sync": s["sync_name"]},
        batch=p.batch, seed=p.seed, sync=s["sync_name"], timing=timing.timing,
        latency_ms=round_stats(stats), median_ci_ms=[round(lo, 6), round(hi, 6)], confidence=timing.confidence,
        throughput_per_s=round(p.batch * 1000.0 / stats["mean"], 6),
        op_count=m.metrics.op_count, compile_time_s=m.metrics.compile_time_s,
        torch=torch.__version__, threads=threads, cpu_count=os.cpu_count(), load_avg_1m=round(s["load0"], 2),
        eager=eager, speedup_vs_eager=speedup, textgen=tg, samples_ms=[round(x, 5) for x in compiled_ms])


def bench_target(project, store: ArtifactStore, target, key: str, timing: TimingSettings | None = None,
                 progress_factory: Callable | None = None, record: bool = True, **kw: Any) -> BenchResult:
    """Benchmark one target's artifact (and its eager model): :func:`bench_targets` of one item
    (``timing`` default: :data:`DEFAULT_WARMUP` warm-up and :data:`DEFAULT_ITERS` timed rounds).

    Raises:
        UserError: the target is not built, or this host cannot run its artifact; bad warmup/iters.
    """
    timing = timing or TimingSettings(warmup=DEFAULT_WARMUP, iters=DEFAULT_ITERS)
    return bench_targets(project, store, [(target, key)], timing, progress_factory=progress_factory,
                         record=record, **kw)[0]


# --------------------------------------------------------------------------------------------------
# formatting

def format_row_table(recs: Sequence[BenchResult]) -> str:
    """One row per benchmarked target: latency percentiles (ms), throughput, eager p50 and speedup."""
    w = max([len(r.target or "") for r in recs] + [6])
    head = (f"{'target':{w}}  {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'samples/s':>11} "
            f"{'eager p50':>10} {'speedup':>8}")
    lines = [head, "-" * len(head)]
    for r in recs:
        lt = r.latency_ms
        e = r.eager
        lines.append(f"{r.target:{w}}  {lt['p50']:9.3f} {lt['p90']:9.3f} {lt['p99']:9.3f} {lt['mean']:9.3f} "
                     f"{r.throughput_per_s:11.1f} "
                     + (f"{e['latency_ms']['p50']:10.3f} {r.speedup_vs_eager:7.2f}x" if e else f"{'-':>10} {'-':>8}"))
    return "\n".join(lines)


def format_compare_table(recs: Sequence[BenchResult], validations: dict[str, dict[str, Any] | None]) -> str:
    """Targets side by side (one column each): latency percentiles, throughput, eager p50 and speedup,
    op count, compile time, and the error against the reference from ``validations`` (target -> record)."""
    cols = [r.target or "" for r in recs]
    w = max([len(c) for c in cols] + [12])

    def fmt(v: Any, spec: str) -> str:
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return format(v, spec)

    rows: list[tuple[str, list[str]]] = []
    for label, get, spec in [
        ("p50 ms", lambda r: r.latency_ms["p50"], ".3f"),
        ("p90 ms", lambda r: r.latency_ms["p90"], ".3f"),
        ("p99 ms", lambda r: r.latency_ms["p99"], ".3f"),
        ("mean ms", lambda r: r.latency_ms["mean"], ".3f"),
        ("samples/s", lambda r: r.throughput_per_s, ".1f"),
        ("eager p50 ms", lambda r: (r.eager or {}).get("latency_ms", {}).get("p50"), ".3f"),
        ("speedup vs eager", lambda r: r.speedup_vs_eager, ".2f"),
        ("op count", lambda r: r.op_count, "d"),
        ("compile s", lambda r: r.compile_time_s, ".1f"),
    ]:
        rows.append((label, [fmt(get(r), spec) for r in recs]))

    def worst(v: dict[str, Any] | None, field: str) -> Any:
        if not v or not v.get("outputs"):
            return None
        vals = [o[field] for o in v["outputs"] if isinstance(o[field], (int, float))]
        if not vals:
            return None
        return min(vals) if field == "cosine_similarity" else max(vals)

    vals = [validations.get(c) for c in cols]
    rows.append(("reference", [(v or {}).get("reference", {}).get("model") or "-" for v in vals]))
    rows.append(("rel L2 error", [fmt(worst(v, "rel_l2_error"), ".1e") for v in vals]))
    rows.append(("max abs error", [fmt(worst(v, "max_abs_error"), ".1e") for v in vals]))
    rows.append(("cosine", [fmt(worst(v, "cosine_similarity"), ".6f") for v in vals]))
    rows.append(("tolerance", [fmt((v or {}).get("tolerance"), ".1e") for v in vals]))
    rows.append(("verdict", [(v or {}).get("verdict", "-") for v in vals]))
    lw = max(len(lbl) for lbl, _ in rows)
    lines = [f"{'':{lw}}  " + "  ".join(f"{c:>{w}}" for c in cols)]
    lines.append("-" * len(lines[0]))
    lines += [f"{lbl:{lw}}  " + "  ".join(f"{x:>{w}}" for x in xs) for lbl, xs in rows]
    return "\n".join(lines)


__all__ = ["BENCH_FORMAT", "DEFAULT_ITERS", "DEFAULT_WARMUP", "SCHEDULE", "BenchResult", "TimingSettings", "bench_target", "bench_targets",
           "device_sync", "format_compare_table", "format_row_table", "host_class", "latency_stats", "percentile", "run_dir_name", "time_calls", "time_interleaved", "time_rounds"]
