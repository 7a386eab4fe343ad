"""Warm-up of a pulled release: call each bucket once on inputs of its exact shapes, then a few more times,
counting the compiles and cache hits each call caused (what a fresh replica pays; ``neuron-build warmup``
and the promotion gate :mod:`neuron_build.release.warmup` run it in a fresh process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_build.backends import find_backend
from neuron_build.runtime.bucketed import BucketedModel

#: Timed calls per bucket after the first call, for the steady-state latency of :func:`warmup`.
STEADY_CALLS = 5
WARMUP_SCHEMA = 1


def _compile_events(backend: str):
    """(snapshot function, delta -> (compiles, cache hits, details)) for a backend: the one backend-name
    dispatch of warm-up: a backend on TorchNeuron's native device (``BackendSpec.native_device``) counts its
    own dynamo metrics; every other backend Inductor's."""
    spec = find_backend(backend)
    if spec is not None and spec.native_device:
        return _neuron_events()
    return _inductor_events()


def _neuron_events():
    """TorchNeuron's compile events: the rows ``torch_neuronx.get_dynamo_metrics()`` added."""
    from neuron_build.compilers.neuron.torchneuron import dynamo_metrics

    def snap():
        return len(dynamo_metrics())

    def delta(before):
        rows = dynamo_metrics()[before:]
        hits = sum(1 for r in rows if r.get("cache_hit") is True)
        return len(rows) - hits, hits, {"graphs": rows}
    return snap, delta


def _inductor_events():
    """Inductor's compile events: FX graph cache misses and bypasses plus C++ kernel libraries built, and
    FX graph cache hits."""
    from neuron_build.compilers.compile_cache import compile_counters, counter_delta, inductor_cache_dir, kernel_files

    cache = inductor_cache_dir()

    def snap_i():
        return compile_counters(), set(kernel_files(cache))

    def delta_i(before):
        counts, kernels = before
        d = counter_delta(counts, compile_counters())
        built = len(set(kernel_files(cache)) - kernels)
        graphs = d["fxgraph_cache_miss"] + d["fxgraph_cache_bypass"]
        return graphs + built, d["fxgraph_cache_hit"], {"counters": d, "graph_compiles": graphs,
                                                       "cpp_kernel_builds": built}
    return snap_i, delta_i


def warmup(folder: str | Path, model: Any = None, *, factory_root: str | Path | None = None) -> dict[str, Any]:
    """Load a pulled release (:meth:`BucketedModel.load`) and call each bucket once on inputs of its exact
    shapes, then :data:`STEADY_CALLS` more times. For compile-cache and torchneuron releases (caches) this
    is what a fresh replica pays; for inductor (AOTInductor) and torchscript releases (compiled models) it
    shows that loading compiles nothing either (the Inductor counters).

    Meant for a fresh process (``neuron-build warmup DIR`` runs one, with empty compiler caches), so that
    every hit comes from the pulled files. Compiles and hits per bucket: Inductor's
    ``fxgraph_cache_miss`` + ``fxgraph_cache_bypass`` (``graph_compiles``) plus the C++ kernel libraries
    built meanwhile (``cpp_kernel_builds``: new ``.so`` files in the Inductor cache folder), and
    ``fxgraph_cache_hit`` (compile-cache), or the rows ``torch_neuronx.get_dynamo_metrics()`` added, split by their cache-hit
    flag (torchneuron; a row without the flag counts as a compile).

    Returns:
        ``{"schema", "release", "model", "backend", "device", "device_note", "installed": {type: entries},
        "buckets": [{"id", "compiles", "cache_hits", "first_call_s", "steady_call_s", ...}],
        "compiles_total", "zero_compiles"}``; latencies in seconds (steady: the median).

    Raises:
        UserError: the folder holds no pulled release (see :meth:`BucketedModel.load`).
    """

    import torch

    from neuron_build.compilers.compile_cache import sync
    from neuron_build.examples import make_inputs

    bm = BucketedModel.load(folder, model, factory_root=factory_root)
    # an AOTInductor or TorchScript release holds compiled models: its warm-up shows that loading and calling
    # them compiles nothing either (Inductor's counters and kernel files stay as they were)
    backend = bm.release.backend
    snap, delta = _compile_events(backend)
    rows = []
    for b in ([] if bm.textgen is not None else bm.buckets):
        # values do not change the compiled graph, shapes and dtypes do; a pulled bucket keeps no value ranges,
        # so integer inputs (token ids, masks) are drawn from [0, 2), valid for any vocabulary
        specs = [{**i, "range": i.get("range") or [0, 2]} for i in b.inputs]
        inputs = tuple(t.to(bm.device) for t in make_inputs(specs, seed=0))
        fn = bm._modules[b.id]

        def call(fn=fn, inputs=inputs):
            with torch.no_grad():
                fn(*inputs)
        rows.append(_warm_row(b.id, [list(i["shape"]) for i in b.inputs], call, lambda: sync(bm.device), snap, delta))
    if bm.textgen is not None:  # a text-generation release: one short generate() per prefill bucket
        rows = _warm_textgen(bm, snap, delta, sync)
    note = None
    if (bm.release.serving or {}).get("device") == "neuron" and bm.device != "neuron":
        note = "no NeuronCore here: ran on CPU tensors"
    total = sum(r["compiles"] for r in rows)
    return {"schema": WARMUP_SCHEMA, "release": bm.release.release, "model": bm.release.model,
            "backend": backend, "device": bm.device, "device_note": note, "installed": bm.installed,
            "env": bm.serving_env, "buckets": rows, "compiles_total": total, "zero_compiles": total == 0}


def _warm_textgen(bm: BucketedModel, snap, delta, sync) -> list[dict[str, Any]]:
    """Warm-up rows of a text-generation release: per prefill bucket, a prompt of its full length through
    ``generate(max_new_tokens=2)`` (the prefill graph, then the decode graph of its batch size), first and
    steady time in seconds, compiles and cache hits."""

    import torch

    rows = []
    eng = bm.textgen
    graphs = (bm.release.textgen or {}).get("graphs") or {}
    for b in bm.buckets:
        if graphs.get(b.id) != "prefill":
            continue
        batch, seq = b.sizes["batch"], int(b.inputs[0]["shape"][1])
        ids = torch.ones(batch, seq, dtype=torch.long)
        rows.append(_warm_row(b.id, [[batch, seq]], lambda ids=ids: eng.generate(ids, max_new_tokens=2),
                              lambda: sync(bm.device), snap, delta))
    return rows


def _warm_row(bucket_id: str, shapes: list, call, settle, snap, delta) -> dict[str, Any]:
    """One warm-up row: ``call()`` once (first call, seconds; the compiles and cache hits it caused), then
    :data:`STEADY_CALLS` more (their median, seconds), each followed by ``settle()`` (the device's sync)."""
    import statistics
    import time

    before = snap()
    t0 = time.perf_counter()
    call()
    settle()
    first = time.perf_counter() - t0
    compiles, hits, extra = delta(before)
    steady = []
    for _ in range(STEADY_CALLS):
        t0 = time.perf_counter()
        call()
        settle()
        steady.append(time.perf_counter() - t0)
    med = statistics.median(steady)
    return {"id": bucket_id, "shapes": shapes, "compiles": compiles, "cache_hits": hits,
            "first_call_s": round(first, 6), "steady_call_s": round(med, 6),
            "first_over_steady": round(first / med, 1) if med > 0 else None, **extra}


__all__ = ["STEADY_CALLS", "WARMUP_SCHEMA", "warmup"]
