"""How long ``buckets suggest`` searches, and what serving-side recording costs per call.

    PYTHONPATH=. python benchmarks/bucket_suggest.py

Prints, for synthetic traffic (a log-normal of sequence lengths up to 8192, batch sizes 1..8): the one-dim exact search
over N distinct values for K buckets, the joint batch x seq search (exact or coordinate descent, as chosen),
and ``TrafficRecorder.record`` per call (microseconds).
"""

from __future__ import annotations

import random
import time

from neuron_build.project.bucket_search import suggest
from neuron_build.traffic import TrafficRecorder


def traffic(n_values: int, seed: int = 0) -> dict[tuple[int, int], int]:
    rng = random.Random(seed)
    out: dict[tuple[int, int], int] = {}
    seen: set[int] = set()
    while len(seen) < n_values:
        s = max(1, min(8192, int(rng.lognormvariate(6.0, 1.0))))
        b = rng.choice([1, 1, 1, 2, 4, 8])
        out[(b, s)] = out.get((b, s), 0) + rng.randint(1, 50)
        seen.add(s)
    return out


def main() -> int:
    for n, k in ((100, 8), (1000, 8), (1000, 16), (2000, 16)):
        t = traffic(n)
        seq = {}
        for (_b, s), c in t.items():
            seq[(s,)] = seq.get((s,), 0) + c
        t0 = time.perf_counter()
        best, method = suggest(seq, ["seq"], k)[-1]
        dt = time.perf_counter() - t0
        print(f"1-D  seq: {len(seq):5} distinct, K={k:2}: {dt * 1000:8.1f} ms  padding {best.padding_ratio:.4f} ({method})")
    for n, k in ((50, 8), (300, 8), (300, 16)):
        t = traffic(n)
        t0 = time.perf_counter()
        curve = suggest(t, ["batch", "seq"], k)
        dt = time.perf_counter() - t0
        best, method = curve[-1]
        print(f"2-D  batch x seq: {len(t):5} distinct shapes, K={k:2}: {dt:7.2f} s  padding "
              f"{best.padding_ratio:.4f} ({method}, {best.buckets})")
    r = TrafficRecorder("m", "r", ["batch", "seq"])
    rng = random.Random(1)
    calls = [({"batch": rng.randint(1, 8), "seq": rng.randint(1, 512)}) for _ in range(100_000)]
    bs = {"batch": 8, "seq": 512}
    t0 = time.perf_counter()
    for c in calls:
        r.record(c, "b8-s512", [("b8-s512", bs, c)])
    dt = time.perf_counter() - t0
    print(f"record: {dt / len(calls) * 1e6:.2f} us per call ({len(r.shapes)} distinct shapes kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
