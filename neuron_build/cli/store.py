"""``neuron-build verify [--deep] [--json]`` and ``neuron-build gc [--dry-run] [--keep-days N] [--json]``."""

from __future__ import annotations

from neuron_build.cli.app import command, mib, open_builder, print_json
from neuron_build.errors import ExitCode
from neuron_build.status import Verdict


def register(add) -> None:
    """Add the ``verify`` and ``gc`` sub-commands."""
    s = add("verify", "check every artifact against its manifest; move corrupt ones to quarantine/")
    s.add_argument("--deep", action="store_true", help="also compare the sha256 of every file (reads every byte)")
    s.add_argument("--json", action="store_true")
    s = add("gc", "remove artifacts that no target, release or channel references, and old leftovers")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    s.add_argument("--keep-days", type=float, default=7.0, metavar="N",
                   help="keep unreferenced artifacts and quarantined objects younger than N days (default 7)")
    s.add_argument("--json", action="store_true")


@command("verify")
def cmd_verify(args) -> int:
    """Verify every object; exit 1 when any was bad (each is quarantined and reported with its reason)."""
    from neuron_build.store.maintenance import verify_store

    b = open_builder(args)
    rep = verify_store(b.store, deep=args.deep)
    if args.json:
        print_json({**rep.to_json(), "verdict": str(Verdict.PASS if rep.clean else Verdict.FAIL)})
        return ExitCode.OK if rep.clean else ExitCode.FAILED
    for bad in rep.bad:
        print(f"BAD  {bad.key[:12]}  {bad.target or '?'}: {bad.reason}"
              + (f" -> {bad.moved_to}" if bad.moved_to else ""))
    for p in rep.problems:
        print(f"REF  {p}")
    how = "sizes and sha256 of every file" if args.deep else "sizes; --deep also checks every sha256"
    print(f"verified {rep.checked} objects in {b.store.location} ({how}): {rep.ok} ok, {len(rep.bad)} bad"
          + (" (moved to quarantine/; the next build compiles them again)" if rep.bad else "")
          + (f", {len(rep.problems)} reference problems" if rep.problems else ""))
    return ExitCode.OK if rep.clean else ExitCode.FAILED


@command("gc")
def cmd_gc(args) -> int:
    """Remove unreferenced artifacts older than the keep window, and leftovers."""
    from neuron_build.store.maintenance import collect_garbage

    b = open_builder(args)
    current = {b.key(t).key for t in b.targets}
    b.keys.save()
    rep = collect_garbage(b.store, keep_keys=current, keep_days=args.keep_days, dry_run=args.dry_run)
    if args.json:
        print_json(rep.to_json())
        return ExitCode.OK
    verb = "would remove" if args.dry_run else "removed"
    for r in rep.removed:
        what = f"{r.key[:12]}  {r.target or ''}".rstrip() if r.kind == "object" else r.path
        print(f"{verb} {r.kind:10} {what}  {mib(r.bytes)}  ({r.why})")
    counts = {}
    for r in rep.removed:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in counts.items()) or "nothing"
    print(f"gc{' (dry run)' if args.dry_run else ''}: {verb} {summary}; "
          f"{'would free' if args.dry_run else 'freed'} {mib(rep.bytes_freed)} ({rep.bytes_freed} bytes); "
          f"kept {rep.referenced} referenced and {rep.kept_young} unreferenced artifacts younger than "
          f"{args.keep_days:g} days")
    return ExitCode.OK
