"""``neuron-build build [-n N] [--executor local|dask] [--scheduler ADDR] [--no-retry-failed] [PATTERN...]``:
compile what the store lacks, through doit on this host, or one Dask task per target on a cluster.

Exit status: 0 when every selected target is in the store, 1 when one failed, 2 for a user error.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from neuron_build.cli.app import (
    command,
    display_note,
    display_text,
    open_workspace,
    positive_int,
    print_json,
    require_writable,
)
from neuron_build.errors import BuildFailed, ExitCode
from neuron_build.status import TargetState
from neuron_build.util import plural

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace


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


@command("build")
def cmd_build(args) -> int:
    """Compile the targets matching PATTERNs (default: all), through doit here or on a Dask cluster."""
    from neuron_build.build.doit.session import SessionExecutor
    from neuron_build.build.fleet.predict import predicted_seconds
    from neuron_build.build.targets import build_targets
    from neuron_build.project.matrix import select
    from neuron_build.project.toolchain import announce_backend

    ws = open_workspace(args, quiet=True if args.json else None)
    chosen = select(ws.targets, args.patterns)  # a pattern that matches nothing is an error before any note
    before = {t.id: ws.state(t) for t in chosen}
    ws.keys.save()
    if any(s != TargetState.CACHED for s in before.values()):
        require_writable(ws.store)  # a target to compile into a read-only store: one line, exit 2, none compiled
        announce_backend(ws.keys.backend_note)  # once, and only when something compiles
    if (args.executor or ws.project.config.build.executor) == "dask":  # the workers make their own Builders
        with _dask_executor(args, ws, chosen) as executor:
            run = build_targets(ws, chosen, executor, before)
    else:
        from neuron_build.build.builder import Builder

        b = Builder(ws)
        todo = sum(before[t.id] != TargetState.CACHED for t in chosen)
        jobs = args.jobs or min(b.default_jobs(), max(1, todo))  # no runner threads for nothing to do
        pending = {t.id: predicted_seconds(ws, t) for t in chosen if before[t.id] != TargetState.CACHED}
        executor = SessionExecutor(b, jobs, retry_failed=not args.no_retry_failed, pending=pending,
                                   select=bool(args.patterns), outstream=sys.stderr if args.json else None)
        run = build_targets(ws, chosen, executor, before)  # with --json, stdout holds only the JSON
    return report(args, ws, chosen, run)


def report(args, ws: Workspace, chosen, run) -> int:
    """Print the end of a build (:class:`~neuron_build.build.targets.TargetsBuilt`): the ``--json`` document
    (exit 1 unless it passed), or the summary, the Dask workers that compiled, the artifacts not pushed.

    Raises:
        BuildFailed: a target failed, a push failed, or doit reported a failure (exit 1).
    """
    if args.json:
        print_json(run.doc())
        return ExitCode.OK if run.ok else ExitCode.FAILED
    run.summary.print()
    per_worker = run.per_worker()
    if per_worker:
        display_text(f"compiled on {plural(len(per_worker), 'Dask worker')}: "
                     + ", ".join(f"{w} ({n})" for w, n in sorted(per_worker.items())))
    unpushed = run.unpushed_keys
    if unpushed:
        display_text(f"  NOT PUSHED {plural(len(unpushed), 'artifact')} to {ws.store.remote_location}: "
                     f"{run.not_pushed[0][1]}; they stay in the local store and the next build (or "
                     "`neuron-build push`) pushes them")
        by_key = {ws.key(t).key: t.id for t in chosen}
        for key in unpushed:
            display_text(f"    not pushed: {by_key.get(key, '?')} (key {key[:16]})")
    if run.summary.failed:
        raise BuildFailed(f"{len(run.summary.failed)} target(s) failed")
    if unpushed:
        raise BuildFailed(f"the push to {ws.store.remote_location} failed")
    if run.status != 0:
        raise BuildFailed("doit reported a failure")
    return ExitCode.OK


def _live_display(total: int, slots: int, expected: dict):
    """The live progress display of a Dask build on a terminal; None elsewhere (the Dask executor's own
    progress lines then, which name the workers)."""
    from neuron_build.build.display import BuildDisplay, wants_live

    return BuildDisplay(total, slots, pending=expected) if wants_live(sys.stderr) else None


@contextmanager
def _dask_executor(args, ws: Workspace, chosen) -> Iterator:
    """The :class:`~neuron_build.build.fleet.dask_executor.DaskBuild` of ``build --executor dask``, with the
    cluster ``[dask] cluster`` starts for it (if any) up while the build runs."""
    from neuron_build.build.fleet.clusters import recorded_times, started_cluster
    from neuron_build.build.fleet.dask_executor import DaskBuild, scheduler_address

    cfg = ws.project.config.build
    with started_cluster(ws.project, recorded_times(ws, chosen)) as start:  # [dask] cluster = "slurm": its own
        start = None if args.scheduler else start  # --scheduler ADDR: that scheduler, no Slurm jobs
        address = start or scheduler_address(args.scheduler, cfg.scheduler, ws.project.path)
        timeout = ws.project.config.dask.start_timeout_s if start else cfg.scheduler_timeout_s
        yield DaskBuild(ws, address, retry_failed=not args.no_retry_failed, report=display_note,
                        connect_timeout_s=timeout, display=_live_display)


__all__ = ["register", "report"]
