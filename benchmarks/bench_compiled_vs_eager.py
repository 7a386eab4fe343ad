"""Compiled-vs-eager latency of the shipped targets, recorded as JSON and a markdown table.

    PYTHONPATH=. python benchmarks/bench_compiled_vs_eager.py [-c buckets.toml] [--iters 200] [--warmup 20]
        [--out benchmarks/results] [PATTERN...]

For every built target matching the patterns (default: all): the artifact and the eager model in the
target dtype, on the same inputs, timed call by call in alternation in one process (:func:`neuron_build.evaluate.bench.bench_target`; the result is
also stored beside the artifact for the release gates). Writes ``<out>/compiled_vs_eager.json`` (the
records) and ``<out>/compiled_vs_eager.md`` (the table). Speedup = eager p50 / compiled p50. The figures
depend on the host: the table's header names it, its thread count and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default=str(HERE.parent / "buckets.toml"))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("patterns", nargs="*")
    args = ap.parse_args(argv)

    from neuron_build.build.builder import Builder
    from neuron_build.evaluate.bench import bench_target
    from neuron_build.evaluate.timing import TimingSettings
    from neuron_build.project.config import load_project
    from neuron_build.project.matrix import select
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(args.config)))
    recs = []
    for t in select(b.ws.targets, args.patterns):
        key = b.ws.key(t).key
        if not b.ws.store.is_complete(key):
            print(f"skipped {t.id}: not built (run `doit build`)", file=sys.stderr)
            continue
        print(f"{t.id} ...", file=sys.stderr, flush=True)
        recs.append(bench_target(b.ws.project, b.ws.store, t, key,
                                    TimingSettings(warmup=args.warmup, iters=args.iters)).to_json())
    if not recs:
        print("nothing benchmarked", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r0 = recs[0]
    head = (f"host {socket.gethostname()} ({platform.machine()}, {os.cpu_count()} CPUs), torch {r0['torch']}, "
            f"{r0['threads']} threads, backend {r0['backend']}, device {r0['device_kind']}; {args.iters} timed "
            f"calls per side after {args.warmup} warm-up calls, artifact and eager interleaved call by call; "
            f"load average at start "
            f"{min(r['load_avg_1m'] for r in recs):.2f}-{max(r['load_avg_1m'] for r in recs):.2f}; {r0['time']}")
    lines = [f"# Compiled vs eager\n\n{head}\n",
             "| target | batch | compiled p50 ms | p90 | p99 | eager p50 ms | p90 | p99 | speedup (p50) | "
             "compiled samples/s | eager samples/s | op count |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        c, e = r["latency_ms"], r["eager"]["latency_ms"]
        lines.append(f"| `{r['target']}` | {r['batch']} | {c['p50']:.3f} | {c['p90']:.3f} | {c['p99']:.3f} | "
                     f"{e['p50']:.3f} | {e['p90']:.3f} | {e['p99']:.3f} | {r['speedup_vs_eager']:.2f}x | "
                     f"{r['throughput_per_s']:.1f} | {r['eager']['throughput_per_s']:.1f} | {r['op_count']} |")
    (out / "compiled_vs_eager.json").write_text(json.dumps({"header": head, "results": recs}, indent=2) + "\n")
    (out / "compiled_vs_eager.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
