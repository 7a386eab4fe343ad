"""``neuron-build verify [--deep] [--repair] [--json]``, ``neuron-build verify --fresh [PATTERN...] [--json]``
(:mod:`neuron_build.build.graph.fresh`) and ``neuron-build gc [--dry-run] [--keep-days N] [--json]``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from neuron_build.cli.app import command, display_text, mib, open_workspace, print_json
from neuron_build.errors import ExitCode, UserError
from neuron_build.status import Verdict
from neuron_build.util import plural

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace

__all__ = ["register", "chosen_store", "require_existing", "cmd_verify", "cmd_verify_fresh", "cmd_gc"]


def register(add) -> None:
    """Add the ``verify`` and ``gc`` sub-commands."""
    s = add("verify", "check every manifest and blob; report damage with the releases it breaks; with --fresh: "
                      "is each target's artifact what a build from today's source and environment makes?")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="with --fresh: the targets to check (default: all)")
    s.add_argument("--fresh", action="store_true",
                   help="re-capture each target's graph key (one probe per model build, nothing compiled) and "
                        "compare it with its artifact's; exit 1 when one differs")
    s.add_argument("--deep", action="store_true", help="also compare the sha256 of every blob (reads every byte)")
    s.add_argument("--repair", action="store_true",
                   help="move damaged manifests and blobs to quarantine/ (the next build compiles them again)")
    s.add_argument("--remote", action="store_true", help="check [build] remote instead of the local store")
    s.add_argument("--json", action="store_true")
    s = add("gc", "remove artifacts that no target, release or channel references, and old leftovers")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    s.add_argument("--keep-days", type=float, default=7.0, metavar="N",
                   help="keep unreferenced artifacts and quarantined objects younger than N days (default 7)")
    s.add_argument("--remote", action="store_true",
                   help="collect [build] remote instead of the local store (roots: every release, and this "
                        "checkout's current targets; other checkouts' entries stay until older than N days)")
    s.add_argument("--json", action="store_true")


def chosen_store(ws: Workspace, remote: bool):
    """The store a maintenance command works on: the local one (of a read-through pair too), or with
    ``remote`` the project's ``[build] remote`` (a user error when it has none)."""
    if remote:
        if ws.store.remote_tier is None:
            raise UserError(f"{ws.project.path}: no [build] remote to work on; drop --remote, or add e.g. "
                            "remote = \"s3://bucket/prefix\" under [build]")
        return ws.store.remote_tier
    return require_existing(ws.store.local_tier)


def require_existing(store):
    """``store`` itself when it exists; a missing local store folder is a user error (a typo in ``[build]
    store`` would otherwise verify or collect an empty store and report success)."""
    root = store.folder
    if root is not None and not root.is_dir():
        raise UserError(f"store {root} does not exist (nothing was built into it); set [build] store "
                        f"(buckets.toml) to the store's folder, or run `neuron-build build` first")
    return store


@command("verify")
def cmd_verify(args) -> int:
    """Verify every manifest and blob; exit 1 when anything was bad. Damage is reported with the releases
    and channels it breaks and the fix; only ``--repair`` moves it (to quarantine/)."""
    from neuron_build.store.verify import NOT_HASHED, verify_store

    if args.fresh:
        return cmd_verify_fresh(args)
    if args.patterns:
        raise UserError(f"verify {' '.join(args.patterns)}: target patterns are for `verify --fresh`; "
                        f"plain verify checks the whole store")
    ws = open_workspace(args)
    store = chosen_store(ws, args.remote)
    if args.repair and store.read_only:
        raise UserError(f"store at {store.location} is read-only; verify --repair moves damaged objects "
                        f"and cannot here (run verify without --repair to report them)")
    shared = None if args.remote else ws.store.remote_tier  # the local cache's channels point at its releases
    rep = verify_store(store, deep=args.deep, repair=args.repair, shared=shared)
    if args.json:
        print_json({**rep.to_json(), "verdict": str(Verdict.of(rep.clean))})
        return ExitCode.OK if rep.clean else ExitCode.FAILED
    for bad in rep.bad:
        what = {"blob": f"blob {bad.key[:16]}", "record": bad.key}.get(bad.kind, bad.key[:12])
        display_text(f"BAD  {what}  {bad.target or '?'}: {bad.reason}"
                     + (f" -> {bad.moved_to}" if bad.moved_to else ""))
        if bad.pinned_by:
            display_text(f"     pinned by {', '.join(bad.pinned_by)}")
        if bad.fix:
            display_text(f"     fix: {bad.fix}")
    for p in rep.problems:
        display_text(f"REF  {p}")
    how = "sha256 of every blob" if args.deep else f"sizes only: {NOT_HASHED}"
    moved = (" (moved to quarantine/; the next build compiles them again)" if args.repair
             else " (reported only; --repair moves them to quarantine/)")
    display_text(f"verified {rep.checked} artifacts and {rep.blobs_checked} blobs in {store.location} ({how}): "
                 f"{rep.ok} ok, {len(rep.bad)} bad" + (moved if rep.bad else "")
                 + (f", {len(rep.problems)} reference problems" if rep.problems else ""))
    return ExitCode.OK if rep.clean else ExitCode.FAILED


def cmd_verify_fresh(args) -> int:
    """``verify --fresh [PATTERN...]``: each matching target's artifact against a fresh capture of its graph
    (:func:`neuron_build.build.graph.fresh.fresh_check`). Exit 1 when an artifact differs or a target could not be
    keyed; unverifiable and unbuilt targets are listed (exit 0 when nothing else is wrong)."""
    import time

    from neuron_build.build.graph.fresh import fresh_check
    from neuron_build.project.matrix import select

    if args.deep or args.repair or args.remote:
        raise UserError("verify --fresh checks targets against today's source; drop --deep, --repair and --remote")
    ws = open_workspace(args)
    targets = select(ws.targets, args.patterns)
    t0 = time.monotonic()
    rep = fresh_check(ws, targets)
    seconds = time.monotonic() - t0
    ws.keys.save()
    code = ExitCode.OK if rep.clean else ExitCode.FAILED
    if args.json:
        print_json({"schema": "neuron-build/verify-fresh/v1", **rep.to_json(), "seconds": round(seconds, 2),
                    "verdict": str(Verdict.of(rep.clean))})
        return code
    for r in rep.rows:
        if r.verdict != "fresh":
            display_text(r.line())
    n = rep.to_json()["counts"]
    display_text(f"verify --fresh: {len(rep.rows)} target(s), {len(rep.probes)} probe(s) in {seconds:.1f} s: "
                 f"{n['fresh']} fresh, {n['differs']} differ, {n['unchecked']} unchecked, "
                 f"{n['unverifiable']} unverifiable (no graph key to compare), {n['unbuilt']} unbuilt")
    return code


@command("gc")
def cmd_gc(args) -> int:
    """Remove what no release, channel or current target references, and leftovers; exit 1 when something
    could not be removed (each listed with its reason)."""
    from neuron_build.store.gc import collect_garbage

    ws = open_workspace(args)
    store = chosen_store(ws, args.remote)
    current = {ws.key(t).key for t in ws.targets}
    ws.keys.save()
    rep = collect_garbage(store, keep_keys=current, keep_days=args.keep_days, dry_run=args.dry_run,
                          current_targets=[t.id for t in ws.targets])
    code = ExitCode.FAILED if rep.failed else ExitCode.OK
    if args.json:
        print_json(rep.to_json())
        return code
    verb = "would remove" if args.dry_run else "removed"
    for r in rep.removed:
        what = f"{r.key[:12]}  {r.target or ''}".rstrip() if r.kind == "object" else r.path
        display_text(f"{verb} {r.kind:10} {what}  {mib(r.bytes)}  ({r.why})")
    for f in rep.failed:
        display_text(f"COULD NOT REMOVE {f.kind} {f.path}: {f.error}")
    for u in rep.unknown:
        display_text(f"left       {u.path}  ({u.error})")
    counts = {}
    for r in rep.removed:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing"
    display_text(f"gc{' (dry run)' if args.dry_run else ''}: {verb} {summary}; "
                 f"{'would free' if args.dry_run else 'freed'} {mib(rep.bytes_freed)} ({rep.bytes_freed} bytes); "
                 f"kept {rep.referenced} referenced and {rep.kept_young} unreferenced artifacts younger than "
                 f"{args.keep_days:g} days"
                 + (f"; could not remove {len(rep.failed)} (listed above)" if rep.failed else "")
                 + (f"; left {plural(len(rep.unknown), 'file')} it did not write" if rep.unknown else ""))
    return code
