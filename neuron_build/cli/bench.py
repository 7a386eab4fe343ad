"""``neuron-build bench [PATTERN...] [--warmup N] [--iters M] [--compare A B ...] [--profile DIR] [--json]``:
latency of built artifacts against the eager model, side-by-side comparisons and profiler traces (see
:mod:`neuron_build.evaluate.bench`).

Exit status: 0 when every selected target was benchmarked (or skipped because this host cannot run it),
1 when one is not built, 2 for a user error.
"""

from __future__ import annotations

import sys
from pathlib import Path

from neuron_build.cli import _builder, _print_json, command
from neuron_build.errors import UserError


def register(add) -> None:
    s = add("bench", "benchmark built artifacts against the eager model; compare targets; profile")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")
    s.add_argument("--warmup", type=int, default=50, help="untimed calls before timing (default 50: the first tens of calls "
                   "of an AOTInductor artifact on CPU are slower)")
    s.add_argument("--iters", type=int, default=100, help="timed calls (default 100)")
    s.add_argument("--compare", nargs="+", metavar="PATTERN", default=[],
                   help="print these targets side by side (latency, op count, compile time, error)")
    s.add_argument("--profile", metavar="DIR", help="also write a torch.profiler trace per target under DIR")
    s.add_argument("--no-eager", action="store_true", help="do not time the eager model")
    s.add_argument("--json", action="store_true", help="print the result records as JSON")


def _progress_factory():
    """tqdm bars on stderr (hidden when stderr is not a terminal)."""
    from tqdm import tqdm

    def make(total: int, desc: str):
        return tqdm(total=total, desc=desc, unit="call", leave=False, file=sys.stderr, disable=None,
                    dynamic_ncols=True)
    return make


@command("bench")
def cmd_bench(args) -> int:
    """Benchmark the targets matching PATTERNs and --compare (default: all targets)."""
    from neuron_build.evaluate.bench import bench_target, format_compare_table, format_row_table, profile_target
    from neuron_build.project.matrix import select
    from neuron_build.evaluate.validate import artifact_device_kind, can_run_here, validate_target

    if args.profile:
        prof_dir = Path(args.profile)
        blocker = next((p for p in (prof_dir, *prof_dir.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise UserError(f"--profile {args.profile}: {blocker} is a file; give a folder for the traces")
    b = _builder(args)
    patterns = list(args.patterns) + list(args.compare)
    chosen = select(b.targets, patterns)
    recs, not_built, skipped = [], [], []
    progress = _progress_factory()
    for i, t in enumerate(chosen, 1):
        key = b.key(t).key
        if not b.store.is_complete(key):
            not_built.append(t.id)
            print(f"NOT BUILT  {t.id}: run `neuron-build build {t.id}`", file=sys.stderr, flush=True)
            continue
        m = b.store.manifest(key)
        runnable, why = can_run_here(artifact_device_kind(m.backend, m.hardware_target))
        if not runnable:
            skipped.append(t.id)
            print(f"SKIPPED  {t.id}: {why}", file=sys.stderr, flush=True)
            continue
        print(f"[{i}/{len(chosen)}] {t.id}: warm-up {args.warmup}, {args.iters} timed calls"
              + ("" if args.no_eager else " each, interleaved with eager"), file=sys.stderr, flush=True)
        rec = bench_target(b.project, b.store, t, key, warmup=args.warmup, iters=args.iters,
                           eager=not args.no_eager, progress_factory=progress)
        if args.compare:
            rec["validation"] = validate_target(b.project, b.store, t, key)
        if args.profile:
            prof = profile_target(b.project, b.store, t, key, args.profile, iters=args.iters, warmup=args.warmup)
            rec["profile"] = {"dir": prof["dir"], "top_ops": prof["top_ops"][:5]}
            if not args.json:
                print(f"\nprofile of {t.id} ({prof['sort_by']}): {prof['dir']}/trace.json\n{prof['table']}")
        recs.append(rec)
    b.keys.save()
    if args.json:
        _print_json(recs)
    elif recs:
        if args.compare:
            print(format_compare_table(recs, {r["target"]: r.get("validation") for r in recs}))
        else:
            print(format_row_table(recs))
        r0 = recs[0]
        print(f"\n{r0['device_kind']} on {r0['host']}, {r0['threads']} threads, sync: {r0['sync']}; "
              f"latency over {r0['iters']} calls after {r0['warmup']} warm-up calls ({r0['timing']}); "
              f"throughput = batch / mean; speedup = eager p50 / compiled p50")
    if skipped:
        print(f"{len(skipped)} skipped (this host cannot run them): {', '.join(skipped)}", file=sys.stderr)
    if not_built:
        print(f"{len(not_built)} not built: {', '.join(not_built)}", file=sys.stderr)
        return 1
    return 0
