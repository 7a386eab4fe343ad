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
from typing import TYPE_CHECKING, Any

from neuron_build.backends import find_backend
from neuron_build.cli.app import command, display_note, display_text, open_workspace, print_json, require_writable
from neuron_build.errors import ExitCode, UserError

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace


def register(add) -> None:
    """Add the ``bench`` sub-command."""
    s = add("bench", "benchmark built artifacts against the eager model; compare targets; profile")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")
    s.add_argument("--warmup", type=int, default=50, help="untimed calls before timing (default 50: the first tens of calls "
                   "of an AOTInductor artifact on CPU are slower)")
    s.add_argument("--iters", type=int, default=None,
                   help="timed rounds (default: adaptive, at least --min-iters, until every median is known "
                        "within --precision or --max-time is spent)")
    s.add_argument("--min-iters", type=int, default=30,
                   help="adaptive: at least this many rounds, within --max-time (default 30)")
    s.add_argument("--precision", type=float, default=0.02,
                   help="adaptive: stop when each median's 95%% interval is within this fraction (default 0.02)")
    s.add_argument("--max-time", type=float, default=60.0, metavar="S",
                   help="adaptive: the whole timing of the session takes at most this many seconds, warm-up "
                        "included (default 60; warm-up takes at most a quarter of it, --min-iters yields to it)")
    s.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads while timing (default: torch's); results compare only with "
                        "results of the same thread count")
    s.add_argument("--against", metavar="CHANNEL",
                   help="also benchmark, in the same session, the release this channel holds (the latency "
                        "gate then compares like with like)")
    s.add_argument("--compare", nargs="+", metavar="PATTERN", default=[],
                   help="print these targets side by side (latency, op count, compile time, error)")
    s.add_argument("--profile", metavar="DIR", help="also write a torch.profiler trace per target under DIR")
    s.add_argument("--no-eager", action="store_true", help="do not time the eager model")
    s.add_argument("--json", action="store_true", help="print the result records as JSON")


def _progress_factory():
    """tqdm bars on stderr (hidden when stderr is not a terminal)."""
    from tqdm import tqdm

    def make(total: int, desc: str):
        return tqdm(total=total, desc=desc, unit="round", leave=False, file=sys.stderr, disable=None,
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

    records: list[Any] = field(default_factory=list)  # BenchResult
    not_built: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def against_items(ws: Workspace, chosen, channel: str) -> list[tuple[Any, str]]:
    """``(target, key)`` of every artifact of the releases ``channel`` holds for the chosen targets'
    models, whose key is not a chosen target's current key and whose target id is still in the matrix.

    Raises:
        UserError: ``channel`` is not declared under ``[release]``.
    """
    from neuron_build.release import check_channel, get_pointer, get_release

    check_channel(ws.project.config.release, channel, "--against")
    current = {ws.key(t).key for t in chosen}
    out: list[tuple[Any, str]] = []
    for model in dict.fromkeys(t.model for t in chosen):
        ptr = get_pointer(ws.store, model, channel)
        if not ptr:
            display_note(f"--against {channel}: {model}/{channel} holds no release; nothing to compare with")
            continue
        for a in get_release(ws.store, model, ptr.release).artifacts:
            if a.key not in current and a.target in ws.by_id and ws.store.is_complete(a.key):
                out.append((ws.by_id[a.target], a.key))
    return out


def timing_settings(args) -> Any:
    """The session's :class:`~neuron_build.evaluate.timing.TimingSettings` from ``bench``'s options."""
    from neuron_build.evaluate.timing import TimingSettings

    return TimingSettings(warmup=args.warmup, iters=args.iters, min_iters=args.min_iters, precision=args.precision,
                          max_time_s=args.max_time, threads=args.threads, eager=not args.no_eager)


def bench_selected(ws: Workspace, chosen, timing, *, compare: bool = False, profile: str | None = None,
                   on_profile: Callable[[Any, dict[str, Any]], None] | None = None, against: str | None = None,
                   wrap: Callable | None = None) -> BenchRun:
    """Benchmark the chosen targets whose current key is built and runs on this host, all in one session
    (:func:`neuron_build.evaluate.bench.bench_targets`; progress on stderr).

    Args:
        timing: the session's :class:`~neuron_build.evaluate.timing.TimingSettings` (:func:`timing_settings`).
        against: also benchmark the release this channel holds (:func:`against_items`).
        wrap: passed to ``bench_targets`` (tests slow an artifact with it).
        compare: also validate each target (its record gets ``validation``).
        profile: also write a ``torch.profiler`` trace per target under this folder (the record gets
            ``profile``: dir and the top 5 ops); ``on_profile(target, profile)`` is called after each.
    """
    from neuron_build.evaluate.bench import bench_targets
    from neuron_build.evaluate.profile import profile_target
    from neuron_build.evaluate.validate import can_run_here, validate_target
    from neuron_build.evaluate.validate_setup import artifact_device_kind

    run = BenchRun()
    progress = _progress_factory()
    items: list[tuple[Any, str]] = []
    for t in chosen:
        key = ws.key(t).key
        if not ws.store.is_complete(key):
            run.not_built.append(t.id)
            display_note(f"NOT BUILT  {t.id}: run `neuron-build build {t.id}`")
            continue
        m = ws.store.manifest(key)
        runnable, why = can_run_here(artifact_device_kind(m.backend, m.hardware_target))
        spec = find_backend(m.backend)
        if not runnable and profile and spec is not None and spec.native_device:
            # TorchNeuron's profiler path still runs (on CPU tensors) and says the figures are not a NeuronCore's
            display_note(f"PROFILE ONLY  {t.id}: {why}: profiling on CPU tensors, no latency benchmark recorded")
            prof = profile_target(ws.project, ws.store, t, key, profile, iters=timing.iters, warmup=timing.warmup)
            if on_profile:
                on_profile(t, prof)
            run.skipped.append(t.id)
            continue
        if not runnable:
            run.skipped.append(t.id)
            display_note(f"SKIPPED  {t.id}: {why}")
            continue
        items.append((t, key))
    if against and items:
        items += against_items(ws, [t for t, _ in items], against)
    if items:
        display_note(f"benchmarking {len(items)} artifact(s) in one session: {timing.describe()}")
        run.records = bench_targets(ws.project, ws.store, items, timing, progress_factory=progress, wrap=wrap,
                                    note=lambda line: display_note(f"bench: {line}"))
    for i, ((t, key), rec) in enumerate(zip(items, list(run.records), strict=True)):
        if compare:
            rec = rec.with_(validation=validate_target(ws.project, ws.store, t, key, keys=ws.keys))
        if profile:
            prof = profile_target(ws.project, ws.store, t, key, profile, iters=timing.iters, warmup=timing.warmup)
            rec = rec.with_(profile={"dir": prof["dir"], "top_ops": prof["top_ops"][:5]})
            if on_profile:
                on_profile(t, prof)
        run.records[i] = rec
    ws.keys.save()
    return run


def format_bench(recs: list[Any], compare: bool) -> str:
    """The table of ``recs`` (side by side with ``compare``), then how they were measured."""
    from neuron_build.evaluate.bench import format_compare_table, format_row_table

    table = (format_compare_table(recs, {r.target: r.validation for r in recs}) if compare
             else format_row_table(recs))
    r0 = recs[0]
    return (f"{table}\n\n{r0.device_kind} on {r0.host}, {r0.threads} threads, sync: {r0.sync}; "
            f"latency over {r0.iters} rounds (stopped by {r0.stopped_by}) after {r0.warmup} warm-up "
            f"rounds ({r0.timing}, one session); "
            f"throughput = batch / mean; speedup = eager p50 / compiled p50")


def _print_profile(t, prof: dict[str, Any]) -> None:
    display_text(f"\nprofile of {t.id} ({prof['sort_by']}): {prof['dir']}/trace.json\n{prof['table']}")


@command("bench")
def cmd_bench(args) -> int:
    """Benchmark the targets matching PATTERNs and --compare (default: all targets)."""
    from neuron_build.project.matrix import select

    timing = timing_settings(args)
    timing.check()  # a bad --iters/--warmup/--threads is one line before any other output
    if args.profile:
        check_profile_dir(args.profile)
    ws = open_workspace(args)
    require_writable(ws.store)  # before any benchmark or validation runs
    chosen = select(ws.targets, list(args.patterns) + list(args.compare))
    run = bench_selected(ws, chosen, timing, compare=bool(args.compare), profile=args.profile,
                         on_profile=None if args.json else _print_profile, against=args.against)
    if args.json:
        print_json([r.to_json() for r in run.records], "records")
    elif run.records:
        display_text(format_bench(run.records, compare=bool(args.compare)))
    if run.skipped:
        display_note(f"{len(run.skipped)} skipped (this host cannot run them): {', '.join(run.skipped)}")
    if run.not_built:
        display_note(f"{len(run.not_built)} not built: {', '.join(run.not_built)}")
        return ExitCode.FAILED
    return ExitCode.OK


__all__ = ["BenchRun", "against_items", "bench_selected", "check_profile_dir", "cmd_bench", "format_bench", "register",
           "timing_settings"]
