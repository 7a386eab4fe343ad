"""``neuron-build validate [PATTERN...] [--json]``: check built artifacts against the eager fp32 CPU
reference and record the results beside them (see :mod:`neuron_build.evaluate.validate`).

Exit status: 0 when every selected target passed (or is recorded as not validated because this host
cannot run it), 1 when one failed or is not built, 2 for a user error (bad config, unknown pattern).
"""

from __future__ import annotations

import sys

from neuron_build.cli import _builder, _print_json, command


def register(add) -> None:
    s = add("validate", "check built artifacts against the eager fp32 CPU reference")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names (default: all)")
    s.add_argument("--json", action="store_true", help="print the stored result records")


@command("validate")
def cmd_validate(args) -> int:
    """Validate the selected targets' artifacts; a target that is not built is reported, not compiled."""
    from neuron_build.project.matrix import select
    from neuron_build.evaluate.validate import summary_line, validate_target

    b = _builder(args)
    chosen = select(b.targets, args.patterns)
    recs, not_built = [], []
    for t in chosen:
        key = b.key(t).key
        if not b.store.is_complete(key):
            not_built.append(t.id)
            if not args.json:
                print(f"NOT BUILT  {t.id}: run `neuron-build build {t.id}` (or `doit validate:{t.id}`)", flush=True)
            continue
        rec = validate_target(b.project, b.store, t, key)
        recs.append(rec)
        if not args.json:
            print(summary_line(rec), flush=True)
            for note in rec.get("diagnosis", []):
                print(f"    {note}", flush=True)
    b.keys.save()
    counts = {v: sum(r["verdict"] == v for r in recs) for v in ("pass", "fail", "not_validated")}
    if args.json:
        _print_json(recs)
    else:
        print(f"{len(chosen)} targets: {counts['pass']} passed, {counts['fail']} failed, "
              f"{counts['not_validated']} not validated, {len(not_built)} not built")
    if counts["fail"] or not_built:
        if args.json:
            print(f"{counts['fail']} failed, {len(not_built)} not built", file=sys.stderr)
        return 1
    return 0
