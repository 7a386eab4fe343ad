"""What serving safety costs per call, printed as JSON: the input checks of ``BucketedModel.__call__`` and of
``generate`` (microseconds per call), and the lock a generation holds on its batch size's KV state.

    PYTHONPATH=. python benchmarks/serving_overhead.py [--release DIR] [--repeats 2000] [--threads 1]

1. **Input checks** of a plain call (:meth:`BucketedModel.check_inputs`: type, dtype, integer ranges, NaN) on
   minilm-shaped inputs (``input_ids`` and ``attention_mask`` int64 ``[batch, seq]`` with ranges
   ``[0, 30522)`` and ``[1, 2)``): median microseconds per call, per shape; and of ``generate``'s request
   (:meth:`TextGenEngine._check_ids`: a 2-D integer tensor, ids in the vocabulary).
2. **The lock**: a ``threading.Lock`` taken and released once per generation chunk, uncontended (median
   microseconds). With ``--release DIR`` (a pulled text-generation release, e.g. of the tiny Llama in
   ``examples/textgen``), also a whole ``generate(max_new_tokens=8)`` with the lock and with a no-op lock in
   its place, and the throughput (generations per second) of 1 and of 2 threads on one model: two threads
   on one batch size take turns (the lock), so their throughput is about one thread's.

The figures depend on the host (its name, threads and load are printed with them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import threading
import time
from pathlib import Path


def _median_us(fn, repeats: int) -> float:
    for _ in range(min(50, repeats)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return round(statistics.median(times) / 1000, 2)


def _plain_model(batch: int, seq: int):
    from neuron_build.runtime import BucketedModel, PulledRelease

    inputs = [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64", "pad": 0, "range": [0, 30522]},
              {"name": "attention_mask", "shape": ["batch", "seq"], "dtype": "int64", "pad": 0, "range": [1, 2]}]
    bucket = {"id": f"b{batch}-s{seq}", "target": f"minilm/b{batch}-s{seq}/fp32/p1", "key": "0" * 64, "sizes": {"batch": batch, "seq": seq}, "artifact": "model.pt",
              "loader": "torch.jit.load", "files": {},
              "inputs": [{"name": i["name"], "shape": [batch, seq], "dtype": "int64"} for i in inputs]}
    rel = {"release": "r-bench", "model": "minilm", "dims": ["batch", "seq"], "inputs": inputs,
           "buckets": [bucket], "backend": "torchscript"}
    return BucketedModel(PulledRelease.from_json(rel, "bench release.json"), Path("."),
                         modules={bucket["id"]: lambda ids, mask: ids})


def input_checks(repeats: int) -> dict:
    import torch

    from neuron_build.compilers.textgen_serve import GraphSet, TextGenEngine

    rows = []
    for batch, seq in ((1, 32), (8, 128), (8, 512), (32, 2048)):
        m = _plain_model(batch, seq)
        ids = torch.randint(0, 30522, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        check = _median_us(lambda m=m, ids=ids, mask=mask: m.check_inputs((ids, mask)), repeats)
        call = _median_us(lambda m=m, ids=ids, mask=mask: m(ids, mask), repeats)
        rows.append({"shape": [batch, seq], "check_us": check, "call_us": call,
                     "check_share_of_a_no_op_call": round(check / call, 3)})
    g = GraphSet(1, prefill={8: lambda **k: None}, decode=lambda **k: None)
    eng = TextGenEngine({1: g}, 4096, "bench", vocab_size=32000, generation={"pad_token_id": 0})
    gen = []
    for batch, seq in ((1, 16), (8, 512), (32, 2048)):
        ids = torch.randint(0, 32000, (batch, seq))
        gen.append({"shape": [batch, seq], "check_us": _median_us(lambda ids=ids: eng._check_ids(ids), repeats)})
    return {"plain_call": rows, "generate_request": gen}


def lock_cost(repeats: int, release: str | None) -> dict:
    lock = threading.Lock()

    def take():
        with lock:
            pass
    out: dict = {"lock_uncontended_us": _median_us(take, repeats)}
    if not release:
        return out
    import torch

    from neuron_build.runtime import BucketedModel

    bm = BucketedModel.load(release)
    prompt = torch.randint(3, 100, (1, 6))
    new = 8
    groups = list(bm.textgen.groups.values())
    locks = [g.lock for g in groups]
    times: dict[bool, list[int]] = {True: [], False: []}
    for i in range(2 * max(20, repeats // 50)):  # alternating, so that the host's load drifts into both alike
        locked = i % 2 == 0
        for g, lk in zip(groups, locks, strict=True):
            g.lock = lk if locked else contextlib.nullcontext()
        t0 = time.perf_counter_ns()
        bm.textgen.generate(prompt, max_new_tokens=new)
        times[locked].append(time.perf_counter_ns() - t0)
    for g, lk in zip(groups, locks, strict=True):
        g.lock = lk
    with_lock, without = (statistics.median(times[k][5:]) / 1000 for k in (True, False))
    out.update({"generate_us_with_lock": round(with_lock, 1), "generate_us_without_lock": round(without, 1),
                "lock_share": round((with_lock - without) / without, 4)})
    calls = 40

    def work(count: int) -> None:
        for _ in range(count):
            bm.textgen.generate(prompt, max_new_tokens=new)
    for n in (1, 2):
        ts = [threading.Thread(target=work, args=(calls // n,)) for _ in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out[f"generations_per_s_{n}_threads"] = round(calls / (time.perf_counter() - t0), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", default=None, help="a pulled text-generation release folder")
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on a loaded host)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)

    print(json.dumps({"host": socket.gethostname(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                      "load": os.getloadavg(), "input_checks": input_checks(args.repeats),
                      "thread_safety": lock_cost(args.repeats, args.release)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
