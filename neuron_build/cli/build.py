"""``neuron-build build [-n N] [--executor local|dask] [--scheduler ADDR] [--no-retry-failed] [PATTERN...]``:
compile what the store lacks, through doit on this host, or one Dask task per target on a cluster.

Exit status: 0 when every selected target is in the store, 1 when one failed, 2 for a user error.
"""

from __future__ import annotations

import sys

from neuron_build.build.summary import NOT_RUN, BuildSummary, log_command
from neuron_build.cli.app import (
    command,
    display_note,
    open_builder,
    plural,
    positive_int,
    print_json,
    require_writable,
)
from neuron_build.errors import BuildFailed, ExitCode
from neuron_build.status import DOWNLOADED, TargetState


def register(add) -> None:
    """Add the ``build`` sub-command."""
    s = add("build", "compile the targets that are not in the store")
    s.add_argument("-n", "--jobs", type=positive_int, default=None,
                   help="compiles to run at once (default: one per CPU, bounded by the host-memory budget)")
    s.add_argument("--executor", choices=("local", "dask"), default=None,
                   help="where compiles run (default: [build] executor, else local)")
    s.add_argument("--scheduler", metavar="ADDR", default=None,
                   help="Dask scheduler, e.g. tcp://host:8786 (default: [build] scheduler, else DASK_SCHEDULER_ADDRESS)")
    s.add_argument("--no-retry-failed", action="store_true",
                   help="skip targets whose current key failed last time (default: retry them)")
    s.add_argument("--json", action="store_true",
                   help="print one object per target (target, key, status, verdict, reason, compile_time_s)")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")


def summarize(b, chosen, before: dict, outcomes: dict) -> BuildSummary:
    """Compare each chosen target's state before and after the build, with the Outcomes of this run.

    ``rows`` (``build --json``), one per chosen target in matrix order: ``target``, ``key``, ``result``
    (``built``, ``cached``, ``reused``: built by another builder meanwhile, ``graph-reused``: the source
    changed, the graph did not, nothing compiled, ``failed``), ``status`` (the
    compile's :class:`~neuron_build.status.Status`, or ``cached``), ``verdict`` (``pass``: the store holds
    it; ``fail``), ``reason`` (one line; empty when built or cached), ``compile_time_s`` (seconds of this
    build's compile, or of the stored artifact's for a cached one; None when failed before compiling)
    and ``log`` (for a failure: the command that shows its log)."""
    after = {t.id: b.state(t) for t in chosen}
    built = [t.id for t in chosen if after[t.id] == TargetState.CACHED
             and (outcomes[t.id].compiled if t.id in outcomes else before[t.id] != TargetState.CACHED)]
    reused = [t.id for t in chosen if t.id in outcomes and outcomes[t.id].reason.startswith("reused")]
    graph_reused = [t.id for t in chosen if t.id in outcomes and outcomes[t.id].reason.startswith("graph unchanged")]
    downloaded = [t.id for t in chosen if t.id in outcomes and outcomes[t.id].reason == DOWNLOADED]
    failed = [t.id for t in chosen if after[t.id] != TargetState.CACHED]
    failures = {}
    for tid in failed:
        o = outcomes.get(tid)
        if o is not None and not o.ok:
            failures[tid] = (str(o.status), o.reason)
        else:
            f = b.store.failure(tid)
            failures[tid] = (str(f.status), f.reason) if f else ("not built", NOT_RUN)
    rows = []
    for t in chosen:
        key = b.key(t).key
        o = outcomes.get(t.id)
        result = ("failed" if t.id in failed else "reused" if t.id in reused else "built" if t.id in built
                  else "graph-reused" if t.id in graph_reused else "cached")
        status, reason, ct = (str(o.status), o.reason, (o.metrics or {}).get("compile_time_s")) if o else (
            "cached" if result != "failed" else None, "", None)
        if result == "failed" and o is None:
            f = b.store.failure(t.id)
            status, reason = (str(f.status), f.reason) if f else ("not built", NOT_RUN)
        if result == "cached" or (result == "reused" and ct is None):
            m = b.store.manifest(key)
            ct = m.metrics.compile_time_s if m else None
        if result in ("built", "cached", "reused") and status == "PASS":
            reason = "" if result == "built" else reason
        row = {"target": t.id, "key": key, "result": result, "status": status,
               "verdict": "fail" if result == "failed" else "pass", "reason": reason if result == "failed" else "",
               "compile_time_s": None if ct is None else round(float(ct), 3)}
        if result == "failed":
            row["log"] = log_command(t.id)
        rows.append(row)
    return BuildSummary([t.id for t in chosen], built, reused, failed, failures, downloaded, rows, graph_reused)


@command("build")
def cmd_build(args) -> int:
    """Compile the targets matching PATTERNs (default: all) through doit."""
    from neuron_build.build.predict import predicted_seconds
    from neuron_build.build.session import BuildSession
    from neuron_build.project.matrix import select

    b = open_builder(args, quiet=True if args.json else None)
    chosen = select(b.targets, args.patterns)  # a pattern that matches nothing is an error before any note
    before = {t.id: b.state(t) for t in chosen}
    b.keys.save()
    if any(s != TargetState.CACHED for s in before.values()):
        require_writable(b.store)  # a target to compile into a read-only store: one line, exit 2, none compiled
        b.announce_backend()  # once, and only when something compiles
    cfg = b.project.config.build
    if (args.executor or cfg.executor) == "dask":
        return _build_on_dask(args, b, chosen, before)
    todo = sum(before[t.id] != TargetState.CACHED for t in chosen)
    jobs = args.jobs or min(b.default_jobs(), max(1, todo))  # no runner threads for nothing to do
    session = BuildSession(b, retry_failed=not args.no_retry_failed, jobs=jobs,
                           pending={t.id: predicted_seconds(b, t) for t in chosen if before[t.id] != TargetState.CACHED})
    rc = session.run([t.id for t in chosen] if args.patterns else None, jobs=jobs,
                     outstream=sys.stderr if args.json else None)  # with --json, stdout holds only the JSON
    summary = summarize(b, chosen, before, session.outcomes)
    unpushed = [k for k, _ in b.store.push_failures]
    if args.json:
        bad = bool(summary.failed or unpushed or rc != 0)
        print_json({"targets": summary.rows, "built": len(summary.built), "cached": summary.cached,
                    "graph_reused": len(summary.graph_reused),
                    "failed": len(summary.failed), "not_pushed": sorted(set(unpushed)),
                    "verdict": "fail" if bad else "pass"})
        return ExitCode.FAILED if bad else ExitCode.OK
    summary.print()
    if unpushed:
        print(f"  NOT PUSHED {plural(len(set(unpushed)), 'artifact')} to {b.store.remote_location}: "
              f"{b.store.push_failures[0][1]}; they stay in the local store and the next build (or "
              "`neuron-build push`) pushes them")
        by_key = {b.key(t).key: t.id for t in chosen}
        for key in dict.fromkeys(unpushed):
            print(f"    not pushed: {by_key.get(key, '?')} (key {key[:16]})")
    if summary.failed:
        raise BuildFailed(f"{len(summary.failed)} target(s) failed")
    if unpushed:
        raise BuildFailed(f"the push to {b.store.remote_location} failed")
    if rc != 0:
        raise BuildFailed("doit reported a failure")
    return ExitCode.OK


def _live_display(total: int, slots: int, expected: dict):
    """The live progress display of a Dask build on a terminal; None elsewhere (the Dask executor's own
    progress lines then, which name the workers)."""
    from neuron_build.build.display import BuildDisplay, wants_live

    return BuildDisplay(total, slots, pending=expected) if wants_live(sys.stderr) else None


def _build_on_dask(args, b, chosen, before) -> int:
    """``build`` with the Dask executor: one task per target on the cluster, then the usual summary and the
    workers that compiled."""
    from neuron_build.build.clusters import recorded_times, started_cluster
    from neuron_build.build.dask_executor import DaskBuild, scheduler_address

    cfg = b.project.config.build
    with started_cluster(b.project, recorded_times(b, chosen)) as start:  # [dask] cluster = "slurm": its own
        start = None if args.scheduler else start  # --scheduler ADDR: that scheduler, no Slurm jobs
        address = start or scheduler_address(args.scheduler, cfg.scheduler, b.project.path)
        timeout = b.project.config.dask.start_timeout_s if start else cfg.scheduler_timeout_s
        run = DaskBuild(b, address, retry_failed=not args.no_retry_failed, report=display_note,
                        connect_timeout_s=timeout, display=_live_display)
        outcomes = run.run(chosen)
    summary = summarize(b, chosen, before, outcomes)
    summary.print()
    per_worker: dict[str, int] = {}
    for tid in summary.built:
        w = run.workers.get(tid)
        if w:
            per_worker[w] = per_worker.get(w, 0) + 1
    if per_worker:
        print(f"compiled on {plural(len(per_worker), 'Dask worker')}: "
              + ", ".join(f"{w} ({n})" for w, n in sorted(per_worker.items())))
    if summary.failed:
        raise BuildFailed(f"{len(summary.failed)} target(s) failed")
    return ExitCode.OK
