"""``neuron-build bench [PATTERN...] [--warmup N] [--iters M] [--compare A B ...] [--profile DIR] [--json]``:
latency of built artifacts against the eager model, side-by-side comparisons and profiler traces (see
:mod:`neuron_build.evaluate.bench`).

Exit status: 0 when every selected target was benchmarked (or skipped because this host cannot run it),
1 when one is not built, 2 for a user error.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.cli.app import command, display_note, open_builder, print_json
from neuron_build.errors import ExitCode, UserError


def register(add) -> None:
    """Add the ``bench`` sub-command."""
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


def check_profile_dir(profile: str) -> None:
    """Raise UserError when a file stands where the ``--profile`` folder (or one of its parents) would be."""
    prof_dir = Path(profile)
    blocker = next((p for p in (prof_dir, *prof_dir.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise UserError(f"--profile {profile}: {blocker} is a file; give a folder for the traces")


@dataclass
class BenchRun:
    """The benchmarks of one ``bench``: result records, and the chosen targets not built or not runnable."""

    records: list[dict[str, Any]] = field(default_factory=list)
    not_built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def bench_selected(b, chosen, *, warmup: int, iters: int, eager: bool = True, compare: bool = False,
                   profile: str | None = None,
                   on_profile: Callable[[Any, dict[str, Any]], None] | None = None) -> BenchRun:
    """Benchmark each chosen target whose current key is built and runs on this host (progress on stderr).

    Args:
        warmup, iters: untimed and timed calls per target.
        eager: also time the eager model, interleaved.
        compare: also validate each target (its record gets ``validation``).
        profile: also write a ``torch.profiler`` trace per target under this folder (the record gets
            ``profile``: dir and the top 5 ops); ``on_profile(target, profile)`` is called after each.
    """
    from neuron_build.evaluate.bench import bench_target, profile_target
    from neuron_build.evaluate.validate import (
        artifact_device_kind,
        can_run_here,
        validate_target,
    )

    run = BenchRun()
    progress = _progress_factory()
    for i, t in enumerate(chosen, 1):
        key = b.key(t).key
        if not b.store.is_complete(key):
            run.not_built.append(t.id)
            display_note(f"NOT BUILT  {t.id}: run `neuron-build build {t.id}`")
            continue
        m = b.store.manifest(key)
        runnable, why = can_run_here(artifact_device_kind(m.backend, m.hardware_target))
        if not runnable and profile and m.backend == "torchneuron":
            # TorchNeuron's profiler path still runs (on CPU tensors) and says the figures are not a NeuronCore's
            display_note(f"PROFILE ONLY  {t.id}: {why}: profiling on CPU tensors, no latency benchmark recorded")
            prof = profile_target(b.project, b.store, t, key, profile, iters=iters, warmup=warmup)
            if on_profile:
                on_profile(t, prof)
            run.skipped.append(t.id)
            continue
        if not runnable:
            run.skipped.append(t.id)
            display_note(f"SKIPPED  {t.id}: {why}")
            continue
        display_note(f"[{i}/{len(chosen)}] {t.id}: warm-up {warmup}, {iters} timed calls"
                     + (" each, interleaved with eager" if eager else ""))
        rec = bench_target(b.project, b.store, t, key, warmup=warmup, iters=iters, eager=eager,
                           progress_factory=progress)
        if compare:
            rec["validation"] = validate_target(b.project, b.store, t, key)
        if profile:
            prof = profile_target(b.project, b.store, t, key, profile, iters=iters, warmup=warmup)
            rec["profile"] = {"dir": prof["dir"], "top_ops": prof["top_ops"][:5]}
            if on_profile:
                on_profile(t, prof)
        run.records.append(rec)
    b.keys.save()
    return run


def format_bench(recs: list[dict[str, Any]], compare: bool) -> str:
    """The table of ``recs`` (side by side with ``compare``), then how they were measured."""
    from neuron_build.evaluate.bench import format_compare_table, format_row_table

    table = (format_compare_table(recs, {r["target"]: r.get("validation") for r in recs}) if compare
             else format_row_table(recs))
    r0 = recs[0]
    return (f"{table}\n\n{r0['device_kind']} on {r0['host']}, {r0['threads']} threads, sync: {r0['sync']}; "
            f"latency over {r0['iters']} calls after {r0['warmup']} warm-up calls ({r0['timing']}); "
            f"throughput = batch / mean; speedup = eager p50 / compiled p50")


def _print_profile(t, prof: dict[str, Any]) -> None:
    print(f"\nprofile of {t.id} ({prof['sort_by']}): {prof['dir']}/trace.json\n{prof['table']}")


@command("bench")
def cmd_bench(args) -> int:
    """Benchmark the targets matching PATTERNs and --compare (default: all targets)."""
    from neuron_build.project.matrix import select

    if args.profile:
        check_profile_dir(args.profile)
    b = open_builder(args)
    chosen = select(b.targets, list(args.patterns) + list(args.compare))
    run = bench_selected(b, chosen, warmup=args.warmup, iters=args.iters, eager=not args.no_eager,
                         compare=bool(args.compare), profile=args.profile,
                         on_profile=None if args.json else _print_profile)
    if args.json:
        print_json(run.records)
    elif run.records:
        print(format_bench(run.records, compare=bool(args.compare)))
    if run.skipped:
        display_note(f"{len(run.skipped)} skipped (this host cannot run them): {', '.join(run.skipped)}")
    if run.not_built:
        display_note(f"{len(run.not_built)} not built: {', '.join(run.not_built)}")
        return ExitCode.FAILED
    return ExitCode.OK
