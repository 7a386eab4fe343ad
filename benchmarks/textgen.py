"""Time to first token and tokens per second of a text-generation model's compiled graphs against the
eager model's transformers ``generate()``, printed as JSON.

    PYTHONPATH=. python benchmarks/textgen.py [-c examples/textgen/buckets.toml] [--model tiny-llama]
        [--new-tokens 32] [--repeats 7] [--threads 1]

Builds nothing: the model's targets must be built (``neuron-build build`` in the project). For each batch
size: time to first token (``generate(max_new_tokens=1)``: prefill plus the argmax) per prefill bucket
with a prompt of the bucket's full length, then ``--new-tokens`` tokens from the smallest bucket's prompt:
tokens per second (batch x new tokens / wall time) and the per-token decode latency (the time beyond the
first token divided by the tokens after it). Medians over ``--repeats`` runs, the compiled and the eager
side alternating; the eager side is ``model.generate(do_sample=False, min_new_tokens=N)`` in the target
dtype (transformers' default dynamic cache). The figures depend on the host (its name, threads and load
are printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default=str(HERE.parent / "examples" / "textgen" / "buckets.toml"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)

    import torch

    from neuron_build.build.builder import Builder
    from neuron_build.compilers.textgen import causal_lm
    from neuron_build.evaluate.textgen_validate import _engine, partners
    from neuron_build.examples import build_model
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    torch.set_num_threads(args.threads)
    b = Builder(Workspace(load_project(args.config)))
    model = args.model or next(n for n, m in b.ws.project.config.models.items() if m.is_textgen)
    spec = b.ws.project.config.models[model]
    dtype = args.dtype or spec.dtypes[0]
    lm = causal_lm(build_model(b.ws.project.root, spec.factory, dict(spec.kwargs), dtype, hf=spec.hf_spec()))
    lm.generation_config.cache_implementation = None
    g = torch.Generator().manual_seed(0)

    def med(fn) -> float:
        xs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            xs.append(time.perf_counter() - t0)
        return statistics.median(xs)

    def eager_gen(p, n):
        with torch.no_grad():
            return lm.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, pad_token_id=0)

    out = {"host": socket.gethostname(), "threads": args.threads, "load_avg_1m": round(os.getloadavg()[0], 2),
           "torch": torch.__version__, "model": model, "dtype": dtype, "backend": b.ws.keys.backend,
           "max_seq_len": spec.max_seq_len, "new_tokens": args.new_tokens, "repeats": args.repeats, "batches": []}
    for batch in spec.buckets["batch"]:
        first = next(t for t in b.ws.targets if t.model == model and t.dtype == dtype and t.graph == "decode"
                     and dict(t.bucket)["batch"] == batch)
        group = partners(b.ws.targets, first)
        chosen = [(t, b.ws.key(t).key, b.ws.store.manifest(b.ws.key(t).key)) for t in group]
        missing = [t.id for t, _, m in chosen if m is None]
        if missing:
            raise SystemExit(f"not built: {', '.join(missing)}; run `neuron-build build {model}` first")
        eng = _engine(b.ws.project, b.ws.store, spec, first, chosen, chosen[0][2].backend)
        row = {"batch": batch, "ttft_s": {}}
        for s in sorted(dict(t.bucket)["seq"] for t in group if t.graph == "prefill"):
            p = torch.randint(3, int(lm.config.vocab_size), (batch, s), generator=g)
            eng.generate(p, max_new_tokens=1)
            row["ttft_s"][f"seq{s}"] = {"compiled": round(med(lambda eng=eng, p=p: eng.generate(p, max_new_tokens=1)), 6),
                                        "eager": round(med(lambda p=p: eager_gen(p, 1)), 6)}
        s0 = min(eng.seqs)
        n = min(args.new_tokens, spec.max_seq_len - s0)
        p = torch.randint(3, int(lm.config.vocab_size), (batch, s0), generator=g)
        equal = torch.equal(eng.generate(p, max_new_tokens=n), eager_gen(p, n)) if dtype == "fp32" else None
        tc = med(lambda eng=eng, p=p, n=n: eng.generate(p, max_new_tokens=n))
        te = med(lambda p=p, n=n: eager_gen(p, n))
        t1c, t1e = row["ttft_s"][f"seq{s0}"]["compiled"], row["ttft_s"][f"seq{s0}"]["eager"]
        row.update({
            "prompt": s0, "generated": n, "tokens_equal_to_eager": equal,
            "tokens_per_s": {"compiled": round(batch * n / tc, 1), "eager": round(batch * n / te, 1)},
            "decode_ms_per_token": {"compiled": round(1000 * (tc - t1c) / max(1, n - 1), 3),
                                    "eager": round(1000 * (te - t1e) / max(1, n - 1), 3)},
            "speedup": round(te / tc, 2)})
        out["batches"].append(row)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
