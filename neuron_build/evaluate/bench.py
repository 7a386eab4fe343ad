"""Latency benchmarks and profiler traces of compiled artifacts, with the eager model as the baseline.

A benchmark session (:func:`bench_targets`): load every selected target's artifact onto its device and
its eager model in the target dtype on the same device, make each target's deterministic inputs (the
validation inputs, :func:`neuron_build.evaluate.validate.validation_seed`), then time them all together
in rounds (:func:`time_rounds`: every callable once per round, the order rotated, each call ended by the
device's synchronise, :func:`device_sync`, and timed with ``time.perf_counter_ns``), ``warmup`` untimed
rounds first, then a fixed or an adaptive number of rounds (until every artifact's median is known within
a precision, or a time budget ends). Reported per target: p50, p90, p99 and mean latency in
milliseconds (percentiles by linear interpolation between order statistics), the median's
distribution-free confidence interval (:func:`neuron_build.util.median_ci`), every sample, throughput in
samples per second (batch / mean latency; the batch is the first dim of the first input), the speedup
over eager (eager p50 / compiled p50), the session id, host class and settings the latency gate compares.
Stored as ``results/<key>/bench/<device kind>--<host>.json`` (schema in :mod:`neuron_build.release.gates`).
:func:`time_calls` and :func:`time_interleaved` are the single-target timers (kept for scripts).

A profiler run (:func:`profile_target`) is separate from the timed run, so profiler overhead never enters
the figures. Torch is imported inside the functions only.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.evaluate.validate import Prepared, can_run_here, neuron_devices, prepare
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import median_ci, percentile, swap_in_folder, utc_now

#: torch.profiler schedule of ``bench --profile``: steps skipped, warmed up, recorded.
SCHEDULE = {"wait": 2, "warmup": 1, "active": 1}
DEFAULT_WARMUP = 10
DEFAULT_ITERS = 100
#: Adaptive timing (``iters=None``): at least this many rounds ...
MIN_ITERS = 30
#: ... then until every median's confidence interval is within ``PRECISION`` of it (relative half-width) ...
PRECISION = 0.02
#: ... or this many seconds of timed rounds have passed, or :data:`MAX_ITERS` rounds.
MAX_TIME_S = 60.0
MAX_ITERS = 5000
#: Confidence of the median intervals recorded with every benchmark.
CONFIDENCE = 0.95
#: Version of the benchmark record (2: samples, median interval, host class, settings, session).
BENCH_FORMAT = 2
#: Operators printed (and written to top_ops.txt) by a profiler run.
TOP_OPS = 15




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


def _round(d: dict[str, float], n: int = 6) -> dict[str, float]:
    return {k: round(v, n) for k, v in d.items()}


def _check_runnable(p: Prepared) -> None:
    ok, why = can_run_here(p.device_kind)
    if not ok:
        raise UserError(f"{p.target.id}: cannot benchmark a {p.device_kind} artifact here: {why}")


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


def time_rounds(fns: Sequence[Callable], inputs: Sequence[tuple], syncs: Sequence[Callable[[], None]], *,
                warmup: int, iters: int | None = None, min_iters: int = MIN_ITERS, max_iters: int = MAX_ITERS,
                max_time_s: float = MAX_TIME_S, precision: float = PRECISION, confidence: float = CONFIDENCE,
                decide: Sequence[int] | None = None, progress: Any = None,
                clock: Callable[[], float] = time.monotonic) -> tuple[list[list[float]], str]:
    """Latencies in ms of several callables, timed in rounds: each round calls every callable once on its
    own inputs, in an order rotated by one each round (so no callable is always first after another's
    cache traffic), each call ended by its ``sync`` and timed with ``time.perf_counter_ns``. A change of
    load on the host during the run hits every callable alike, so their ratios stay meaningful on a busy
    machine.

    The number of rounds: exactly ``iters`` when given; otherwise adaptive: at least ``min_iters``, then
    until the median of every callable in ``decide`` (indices; default all) has a confidence interval
    (:func:`neuron_build.util.median_ci` at ``confidence``) whose half-width is at most ``precision`` times
    the median, or ``max_time_s`` seconds of timed rounds have passed, or ``max_iters`` rounds.

    Args:
        warmup: untimed rounds first (>= 0).
        progress: advanced once per round (warm-up included), or None.

    Returns:
        One list of latencies (ms) per callable, in the order of ``fns``; and why timing stopped:
        ``"iters"`` (the fixed count), ``"precision"``, ``"time"`` or ``"max_iters"``.
    """
    import torch

    n = len(fns)
    out: list[list[float]] = [[] for _ in fns]
    watch = list(range(n)) if decide is None else list(decide)

    def precise() -> bool:
        for i in watch:
            med, lo, hi = median_ci(out[i], confidence)
            if med <= 0 or (hi - lo) / 2 > precision * med:
                return False
        return True

    with torch.inference_mode():
        for _ in range(warmup):
            for i in range(n):
                fns[i](*inputs[i])
                syncs[i]()
            if progress is not None:
                progress.update(1)
        t_start = clock()
        r = 0
        while True:
            for j in range(n):
                i = (j + r) % n
                t0 = time.perf_counter_ns()
                fns[i](*inputs[i])
                syncs[i]()
                out[i].append((time.perf_counter_ns() - t0) / 1e6)
            r += 1
            if progress is not None:
                progress.update(1)
            if iters is not None:
                if r >= iters:
                    return out, "iters"
                continue
            if r >= max_iters:
                return out, "max_iters"
            if r >= min_iters:
                if r % 10 == 0 and precise():
                    return out, "precision"
                if clock() - t_start >= max_time_s:
                    return out, "time"


def bench_targets(project, store: ArtifactStore, items: Sequence[tuple[Any, str]], *, warmup: int = DEFAULT_WARMUP,
                  iters: int | None = None, min_iters: int = MIN_ITERS, max_time_s: float = MAX_TIME_S,
                  precision: float = PRECISION, confidence: float = CONFIDENCE, eager: bool = True,
                  progress_factory: Callable | None = None, record: bool = True,
                  wrap: Callable[[Any, Callable], Callable] | None = None,
                  threads: int | None = None) -> list[dict[str, Any]]:
    """Benchmark several targets' artifacts (and their eager models) in one session and store the results.

    Every artifact and eager model is loaded first; then all are timed together in rounds
    (:func:`time_rounds`): artifacts and eager models alike, so two targets benchmarked together (the
    fp32 and bf16 buckets of a model, a candidate and the release it replaces) saw the same host load and
    their ratio is meaningful. The records share a ``session`` id, which the latency gate prefers.

    Args:
        items: ``(target, key)`` pairs (the key may be another than the target's current one, e.g. the
            artifact of a release).
        warmup: untimed rounds (>= 0).
        iters: timed rounds (>= 1), or None: adaptive (``min_iters``, ``precision``, ``max_time_s``; the
            artifacts' medians decide, not the eager models').
        eager: also time each target's eager model in the target dtype on the same device and inputs.
        progress_factory: ``f(total, desc)`` returning a progress bar (tqdm-like) or None.
        record: store each result under ``results/<key>/bench/<device kind>--<host>.json``.
        wrap: ``wrap(target, fn)`` returns the callable to time instead of the loaded artifact ``fn``
            (tests slow an artifact down with it).
        threads: torch intra-op threads for the session (``torch.set_num_threads``; None: torch's
            default). Recorded in ``settings``: results with other thread counts do not compare. On a
            shared 2-core host, 2 threads put some processes into a mode where every call waits for a
            descheduled OpenMP thread (seen: 0.15 ms vs 100-250 ms per call of one artifact, changing
            from process to process); 1 thread did not.

    Returns:
        One record per item, in order: ``format`` (:data:`BENCH_FORMAT`), ``target``, ``key``, ``model``,
        ``dtype``, ``backend``, ``device_kind``, ``device``, ``host``, ``host_class`` (:func:`host_class`),
        ``time``, ``session``, ``iters`` (timed rounds), ``warmup``, ``stopped_by``, ``settings`` (what must
        be equal for two results to compare: ``threads``, ``timing``, ``warmup``, ``sync``), ``batch``,
        ``sync``, ``timing``, ``latency_ms`` (p50/p90/p99/mean/min/max/std, ms), ``median_ci_ms``
        (``[low, high]`` at ``confidence``), ``confidence``, ``samples_ms`` (every timed latency, ms),
        ``throughput_per_s`` (samples/s over the mean), ``eager`` and ``speedup_vs_eager`` (eager p50 /
        compiled p50) when ``eager``, ``op_count``, ``compile_time_s``, ``torch``, ``threads``,
        ``cpu_count`` and ``load_avg_1m`` (when the session started).

    Raises:
        UserError: a target is not built, or this host cannot run its artifact; bad warmup/iters.
    """
    import torch

    if (iters is not None and iters < 1) or warmup < 0 or min_iters < 1:
        raise UserError(f"--iters must be >= 1 and --warmup >= 0 (got iters {iters}, warmup {warmup})")
    if threads is not None:
        if threads < 1:
            raise UserError(f"--threads must be >= 1 (got {threads})")
        torch.set_num_threads(threads)
    load0 = os.getloadavg()[0]
    session = uuid.uuid4().hex[:16]
    preps = []
    for target, key in items:
        p = prepare(project, store, target, key)
        _check_runnable(p)
        preps.append(p)
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
    n_art = len(fns)
    if eager:
        for idx, ((target, _key), p, sync) in enumerate(zip(items, preps, syncs[:n_art], strict=True)):
            fns.append(textgen[idx][1] if idx in textgen else p.eager(target.dtype, device=p.device))
            inputs.append(textgen[idx][2] if idx in textgen else p.device_inputs())
            syncs.append(sync)
    desc = (f"{items[0][0].id}" if len(items) == 1 else f"{len(items)} targets") + (" + eager" if eager else "")
    bar = progress_factory(warmup + iters if iters else None, desc) if progress_factory else None
    try:
        times, stopped = time_rounds(fns, inputs, syncs, warmup=warmup, iters=iters, min_iters=min_iters,
                                     max_time_s=max_time_s, precision=precision, confidence=confidence,
                                     decide=range(n_art), progress=bar)
    finally:
        if bar is not None:
            bar.close()
    host, now = socket.gethostname(), utc_now()
    timing = "interleaved with eager" if eager else "compiled only"
    recs = []
    for idx, ((target, key), p) in enumerate(zip(items, preps, strict=True)):
        compiled_ms = times[idx]
        stats = latency_stats(compiled_ms)
        _med, lo, hi = median_ci(compiled_ms, confidence)
        m = p.manifest
        threads = torch.get_num_threads()
        rec: dict[str, Any] = {
            "format": BENCH_FORMAT, "target": target.id, "key": key, "model": target.model, "dtype": target.dtype,
            "backend": m.backend, "device_kind": p.device_kind, "device": p.device, "host": host,
            "host_class": host_class(p.device_kind, p.device), "time": now, "session": session,
            "iters": len(compiled_ms), "warmup": warmup, "stopped_by": stopped,
            "settings": {"threads": threads, "timing": timing, "warmup": warmup, "sync": names[idx]},
            "batch": p.batch, "seed": p.seed, "sync": names[idx], "timing": timing,
            "latency_ms": _round(stats), "median_ci_ms": [round(lo, 6), round(hi, 6)], "confidence": confidence,
            "throughput_per_s": round(p.batch * 1000.0 / stats["mean"], 6),
            "op_count": m.metrics.op_count, "compile_time_s": m.metrics.compile_time_s,
            "torch": torch.__version__, "threads": threads, "cpu_count": os.cpu_count(),
            "load_avg_1m": round(load0, 2),
        }
        if eager:
            es = latency_stats(times[n_art + idx])
            rec["eager"] = {"latency_ms": _round(es), "throughput_per_s": round(p.batch * 1000.0 / es["mean"], 6),
                            "device": p.device, "dtype": target.dtype}
            rec["speedup_vs_eager"] = round(es["p50"] / stats["p50"], 6)
        if idx in textgen:  # prefill: time to first token; decode: per-token latency, tokens per second
            tg = {"graph": target.graph, "p50_ms": round(stats["p50"], 6), "p99_ms": round(stats["p99"], 6)}
            if target.graph == "prefill":
                tg["ttft_ms"] = tg["p50_ms"]
            else:
                tg["tokens_per_s"] = round(p.batch * 1000.0 / stats["p50"], 3)
            rec["textgen"] = tg
        rec["samples_ms"] = [round(x, 5) for x in compiled_ms]
        if record:
            store.put_result(key, "bench", f"{p.device_kind}--{host}", rec)
        recs.append(rec)
    return recs


def bench_target(project, store: ArtifactStore, target, key: str, warmup: int = DEFAULT_WARMUP,
                 iters: int | None = DEFAULT_ITERS, eager: bool = True, progress_factory: Callable | None = None,
                 record: bool = True, **kw: Any) -> dict[str, Any]:
    """Benchmark one target's artifact (and its eager model): :func:`bench_targets` of one item.

    Raises:
        UserError: the target is not built, or this host cannot run its artifact; bad warmup/iters.
    """
    return bench_targets(project, store, [(target, key)], warmup=warmup, iters=iters, eager=eager,
                         progress_factory=progress_factory, record=record, **kw)[0]


def run_dir_name(target_id: str, key: str) -> str:
    """The folder of one target's profiler run: ``<target id with / as _>-<key[:12]>``."""
    return f"{target_id.replace('/', '_')}-{key[:12]}"


def profile_target(project, store: ArtifactStore, target, key: str, out_dir: str | Path, top: int = TOP_OPS,
                   iters: int | None = None, warmup: int | None = None) -> dict[str, Any]:
    """One ``torch.profiler`` run of a target's artifact, written to ``out_dir/<run dir name>/``.

    The schedule is :data:`SCHEDULE` (wait 2, warm-up 1, active 1: four calls, the fourth recorded), with
    the device's synchronise before each ``step()``. Activities: CPU, CUDA on a CUDA artifact, and
    ``PrivateUse1`` (the NeuronCore's profiler activity [guess]) when the host has a NeuronCore. Files,
    written into a temporary folder and renamed into place together, so a trace is never paired with
    another run's files (a previous run of the same target and key is replaced whole):

    - ``trace.json``: the Chrome trace (chrome://tracing, Perfetto);
    - ``top_ops.txt``: the profiler's table of the top operators by self device time (self CPU time on
      the CPU);
    - ``run.json``: ``key``, ``target``, ``iters``, ``warmup`` (the benchmark's settings of this run, or
      None), ``schedule``, ``device``, ``device_kind``, ``host``, ``time``, ``torch``, ``activities``,
      ``sort_by``, ``top_ops`` (name, calls, self CPU and self device time in microseconds),
      ``wall_clock_ms`` (10 plain calls without the profiler: p50/p90/p99/mean/...), ``profiled_step_ms``
      (each profiled step's wall time) and ``device_note`` (why figures are not a device's, or None).

    A ``torchneuron`` artifact (the TorchNeuron profiling practice [doc]) adds the ``PrivateUse1`` activity
    and ``experimental_config=torch_neuronx.profiling.NeuronConfig(device_streams=True,
    runtime_streams=True, capture_cores=(0,), correlate_device_time=True)`` so device time maps back to
    operators, synchronises with ``torch.neuron.synchronize()`` each step, and keeps the NEFF and device
    trace (NTFF) files it wrote beside ``trace.json`` (``run.json`` ``device_files``: the pairs by hash).
    On a host without a NeuronCore it runs on CPU tensors and ``device_note`` says so.

    On the CPU, an AOTInductor artifact's kernels run inside its shared library without profiler
    ranges [seen, torch 2.13]: its trace shows the call (an ``artifact <target>`` range) and the ATen ops it
    calls through the dispatcher only; a TorchScript artifact's trace shows every operator.

    Returns:
        The ``run.json`` content plus ``dir`` (the run folder) and ``table`` (the printed table).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    p = prepare(project, store, target, key)
    native = p.manifest.backend == "torchneuron"
    device_note = None
    if native and not neuron_devices():
        device_note = "no NeuronCore here: profiled on CPU tensors; device times and traces are not a NeuronCore's"
    else:
        _check_runnable(p)
    sync, _ = device_sync(p.device_kind)
    if native:
        import torch_neuronx  # noqa: F401  registers torch.neuron

        def sync() -> None:
            torch.neuron.synchronize()  # type: ignore[attr-defined]  [doc: TorchNeuron profiling practice]
    fn = p.load_artifact()
    inputs = p.device_inputs()
    activities = [ProfilerActivity.CPU]
    if p.device_kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    if (native or neuron_devices()) and hasattr(ProfilerActivity, "PrivateUse1"):
        activities.append(ProfilerActivity.PrivateUse1)
    on_device = p.device_kind != "cpu"
    sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
    # the plain wall clock, without the profiler, reported beside the profiled steps
    plain = latency_stats(time_calls(fn, inputs, 2, 10, sync))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = run_dir_name(target.id, key)
    tmp = out_dir / f".{name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        traces: list[str] = []

        def ready(prof) -> None:
            path = tmp / "trace.json"
            prof.export_chrome_trace(str(path))
            traces.append(str(path))

        steps = SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]
        extra: dict[str, Any] = {}
        neuron_cfg = None
        if native:
            from torch_neuronx.profiling import NeuronConfig  # [doc: TorchNeuron profiling]

            neuron_cfg = NeuronConfig(output_dir=str(tmp / "device"), device_streams=True, runtime_streams=True,
                                      capture_cores=(0,), correlate_device_time=True)
            extra["experimental_config"] = neuron_cfg
        step_ms: list[float] = []
        with torch.inference_mode(), profile(activities=activities, schedule=schedule(**SCHEDULE),
                                             on_trace_ready=ready, record_shapes=True, **extra) as prof:
            for _ in range(steps):
                t0 = time.perf_counter_ns()
                with record_function(f"artifact {target.id}"):
                    fn(*inputs)
                sync()
                step_ms.append((time.perf_counter_ns() - t0) / 1e6)
                prof.step()
        if not traces:
            raise RuntimeError("the profiler wrote no trace")
        pairs = _pair_device_files(tmp) if native else []
        events = prof.key_averages()
        table = events.table(sort_by=sort_by, row_limit=top)

        def dev_time(e) -> float:
            return float(getattr(e, "self_device_time_total", 0.0) or 0.0)

        ranked = sorted(events, key=(dev_time if on_device else (lambda e: e.self_cpu_time_total)), reverse=True)
        top_ops = [{"name": e.key, "calls": e.count, "self_cpu_time_us": round(e.self_cpu_time_total, 3),
                    "self_device_time_us": round(dev_time(e), 3)} for e in ranked[:top]]
        run = {"key": key, "target": target.id, "iters": iters, "warmup": warmup, "schedule": dict(SCHEDULE),
               "device": p.device, "device_kind": p.device_kind, "host": socket.gethostname(), "time": utc_now(),
               "torch": torch.__version__, "activities": [str(a).split(".")[-1] for a in activities],
               "sort_by": sort_by, "top_ops": top_ops, "wall_clock_ms": _round(plain),
               "profiled_step_ms": [round(x, 6) for x in step_ms], "device_note": device_note}
        if native:
            run["neuron_config"] = {"device_streams": True, "runtime_streams": True, "capture_cores": [0],
                                    "correlate_device_time": True}
            run["device_files"] = pairs
        (tmp / "top_ops.txt").write_text(table + "\n")
        (tmp / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        dest = out_dir / name
        swap_in_folder(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**run, "dir": str(dest), "table": table}


def _pair_device_files(run_dir: Path) -> list[dict[str, Any]]:
    """Move the NEFF and device-trace (NTFF) files TorchNeuron's profiler wrote into ``run_dir/device`` up
    into ``run_dir`` beside ``trace.json``, paired by their shared numeric hash (``<hash>.neff`` with
    ``<hash>.ntff``) [doc: the three are paired by one hash and must stay together; the file names are a
    guess]. Returns ``[{"hash", "neff", "ntff"}]`` (a file without its partner is listed with None)."""
    dev = run_dir / "device"
    if not dev.is_dir():
        return []
    by_hash: dict[str, dict[str, str | None]] = {}
    for f in sorted(dev.iterdir()):
        if f.suffix in (".neff", ".ntff") and f.is_file():
            os.replace(f, run_dir / f.name)
            by_hash.setdefault(f.stem, {"neff": None, "ntff": None})[f.suffix[1:]] = f.name
    shutil.rmtree(dev, ignore_errors=True)
    return [{"hash": h, **v} for h, v in sorted(by_hash.items())]


# --------------------------------------------------------------------------------------------------
# formatting

def format_row_table(recs: Sequence[dict[str, Any]]) -> str:
    """One row per benchmarked target: latency percentiles (ms), throughput, eager p50 and speedup."""
    w = max([len(r["target"]) for r in recs] + [6])
    head = (f"{'target':{w}}  {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'samples/s':>11} "
            f"{'eager p50':>10} {'speedup':>8}")
    lines = [head, "-" * len(head)]
    for r in recs:
        lt = r["latency_ms"]
        e = r.get("eager")
        lines.append(f"{r['target']:{w}}  {lt['p50']:9.3f} {lt['p90']:9.3f} {lt['p99']:9.3f} {lt['mean']:9.3f} "
                     f"{r['throughput_per_s']:11.1f} "
                     + (f"{e['latency_ms']['p50']:10.3f} {r['speedup_vs_eager']:7.2f}x" if e else f"{'-':>10} {'-':>8}"))
    return "\n".join(lines)


def format_compare_table(recs: Sequence[dict[str, Any]], validations: dict[str, dict[str, Any] | None]) -> str:
    """Targets side by side (one column each): latency percentiles, throughput, eager p50 and speedup,
    op count, compile time, and the error against the reference from ``validations`` (target -> record)."""
    cols = [r["target"] for r in recs]
    w = max([len(c) for c in cols] + [12])

    def fmt(v: Any, spec: str) -> str:
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return format(v, spec)

    rows: list[tuple[str, list[str]]] = []
    for label, get, spec in [
        ("p50 ms", lambda r: r["latency_ms"]["p50"], ".3f"),
        ("p90 ms", lambda r: r["latency_ms"]["p90"], ".3f"),
        ("p99 ms", lambda r: r["latency_ms"]["p99"], ".3f"),
        ("mean ms", lambda r: r["latency_ms"]["mean"], ".3f"),
        ("samples/s", lambda r: r["throughput_per_s"], ".1f"),
        ("eager p50 ms", lambda r: (r.get("eager") or {}).get("latency_ms", {}).get("p50"), ".3f"),
        ("speedup vs eager", lambda r: r.get("speedup_vs_eager"), ".2f"),
        ("op count", lambda r: r.get("op_count"), "d"),
        ("compile s", lambda r: r.get("compile_time_s"), ".1f"),
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


__all__ = ["BENCH_FORMAT", "SCHEDULE", "bench_target", "bench_targets", "host_class", "time_rounds", "device_sync", "format_compare_table", "format_row_table", "latency_stats",
           "percentile", "profile_target", "run_dir_name", "time_calls", "time_interleaved"]
