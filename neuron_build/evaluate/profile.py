"""Profiler runs of compiled artifacts: one ``torch.profiler`` run per target, separate from the timed
benchmark (:mod:`neuron_build.evaluate.bench`), so profiler overhead never enters the figures. Torch is
imported inside the functions only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_build.backends import find_backend
from neuron_build.errors import UserError
from neuron_build.evaluate.timing import device_sync, latency_stats, time_calls
from neuron_build.evaluate.validate import can_run_here, neuron_devices
from neuron_build.evaluate.validate_run import Prepared, prepare
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import swap_in_folder, utc_now

#: torch.profiler schedule of ``bench --profile``: steps skipped, warmed up, recorded.
SCHEDULE = {"wait": 2, "warmup": 1, "active": 1}
#: Operators printed (and written to top_ops.txt) by a profiler run.
TOP_OPS = 15


def round_stats(d: dict[str, float], n: int = 6) -> dict[str, float]:
    """Every figure of ``d`` rounded to ``n`` digits."""
    return {k: round(v, n) for k, v in d.items()}


def check_runnable(p: Prepared) -> None:
    """Raise UserError when this host cannot run the prepared artifact (the target and why named)."""
    ok, why = can_run_here(p.device_kind)
    if not ok:
        raise UserError(f"{p.target.id}: cannot benchmark a {p.device_kind} artifact here: {why}")


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

    p = prepare(project, store, target, key)
    spec = find_backend(p.manifest.backend)
    native = spec is not None and spec.native_device  # TorchNeuron's eager neuron device
    device_note = None
    if native and not neuron_devices():
        device_note = "no NeuronCore here: profiled on CPU tensors; device times and traces are not a NeuronCore's"
    else:
        check_runnable(p)
    sync, _ = device_sync(p.device_kind)
    if native:
        sync = _neuron_sync()
    fn = p.load_artifact()
    inputs = p.device_inputs()
    activities = _activities(p.device_kind, native)
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
        prof, step_ms = _profiled_steps(lambda: fn(*inputs), sync, f"artifact {target.id}", activities, tmp, native)
        pairs = _pair_device_files(tmp) if native else []
        table, top_ops = _top_ops(prof.key_averages(), sort_by, top, on_device)
        run = {"key": key, "target": target.id, "iters": iters, "warmup": warmup, "schedule": dict(SCHEDULE),
               "device": p.device, "device_kind": p.device_kind, "host": socket.gethostname(), "time": utc_now(),
               "torch": torch.__version__, "activities": [str(a).split(".")[-1] for a in activities],
               "sort_by": sort_by, "top_ops": top_ops, "wall_clock_ms": round_stats(plain),
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


def _neuron_sync() -> Callable[[], None]:
    """TorchNeuron's synchronise (``torch.neuron.synchronize()``), registered by importing ``torch_neuronx``."""
    import torch
    import torch_neuronx  # noqa: F401  registers torch.neuron

    def sync() -> None:
        torch.neuron.synchronize()  # type: ignore[attr-defined]  [doc: TorchNeuron profiling practice]

    return sync


def _activities(device_kind: str, native: bool) -> list[Any]:
    """The profiler's activities: CPU, CUDA on a CUDA artifact, ``PrivateUse1`` for a NeuronCore."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if device_kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
    if (native or neuron_devices()) and hasattr(ProfilerActivity, "PrivateUse1"):
        activities.append(ProfilerActivity.PrivateUse1)
    return activities


def _profiled_steps(call: Callable[[], Any], sync: Callable[[], None], label: str, activities: list[Any],
                    tmp: Path, native: bool) -> tuple[Any, list[float]]:
    """Run ``call`` on :data:`SCHEDULE` under the profiler (each call in a ``label`` range, then ``sync``),
    the Chrome trace written to ``tmp/trace.json`` (TorchNeuron's device files under ``tmp/device`` when
    ``native``). Returns the profiler and each step's wall time in ms; RuntimeError if no trace was written."""
    import torch
    from torch.profiler import profile, record_function, schedule

    traces: list[str] = []

    def ready(prof) -> None:
        path = tmp / "trace.json"
        prof.export_chrome_trace(str(path))
        traces.append(str(path))

    steps = SCHEDULE["wait"] + SCHEDULE["warmup"] + SCHEDULE["active"]
    extra: dict[str, Any] = {}
    if native:
        from torch_neuronx.profiling import NeuronConfig  # [doc: TorchNeuron profiling]

        extra["experimental_config"] = NeuronConfig(output_dir=str(tmp / "device"), device_streams=True,
                                                    runtime_streams=True, capture_cores=(0,),
                                                    correlate_device_time=True)
    step_ms: list[float] = []
    with torch.inference_mode(), profile(activities=activities, schedule=schedule(**SCHEDULE),
                                         on_trace_ready=ready, record_shapes=True, **extra) as prof:
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            with record_function(label):
                call()
            sync()
            step_ms.append((time.perf_counter_ns() - t0) / 1e6)
            prof.step()
    if not traces:
        raise RuntimeError("the profiler wrote no trace")
    return prof, step_ms


def _top_ops(events: Any, sort_by: str, top: int, on_device: bool) -> tuple[str, list[dict[str, Any]]]:
    """The profiler's printed table of the ``top`` operators by ``sort_by``, and the same operators as records
    (name, calls, self CPU and self device time in microseconds)."""

    def dev_time(e) -> float:
        return float(getattr(e, "self_device_time_total", 0.0) or 0.0)

    table = events.table(sort_by=sort_by, row_limit=top)
    ranked = sorted(events, key=(dev_time if on_device else (lambda e: e.self_cpu_time_total)), reverse=True)
    return table, [{"name": e.key, "calls": e.count, "self_cpu_time_us": round(e.self_cpu_time_total, 3),
                    "self_device_time_us": round(dev_time(e), 3)} for e in ranked[:top]]


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


__all__ = ["SCHEDULE", "TOP_OPS", "check_runnable", "profile_target", "round_stats", "run_dir_name"]
