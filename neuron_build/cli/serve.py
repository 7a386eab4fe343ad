"""``neuron-build warmup DIR [--json]``: warm a pulled compile-cache or torchneuron release in a fresh process.

The command re-runs itself in a fresh interpreter (``--in-process`` there) with an empty
``TORCHINDUCTOR_CACHE_DIR``, so every cache hit it reports comes from the pulled files, never from this
host's own caches. Exit status 0 when no bucket compiled anything, 1 otherwise (the check failed), 2 for
a folder that is not such a release.
"""

from __future__ import annotations

from neuron_build.cli.app import command, display_text, print_json
from neuron_build.errors import ExitCode

#: The ``--json`` schema of ``warmup``.
SCHEMA = "neuron-build/warmup/v1"


def register(add) -> None:
    """Add the ``warmup`` sub-command."""
    s = add("warmup", "load a pulled compile-cache or torchneuron release in a fresh process, call each bucket "
                      "once, and report compiles, cache hits and first-call vs steady-state latency")
    s.add_argument("dir", help="the folder `neuron-build pull` wrote")
    s.add_argument("--factory-root", default=None,
                   help="folder put first on sys.path to import the recorded model factory (default: the current "
                        "folder)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--in-process", action="store_true", help="run here instead of in a fresh process (internal)")


def format_report(r: dict) -> str:
    """One line per bucket (compiles, hits, first call and steady state), then the verdict."""
    lines = [f"release {r['release']} ({r['backend']}) on {r['device']}"
             + (f" ({r['device_note']})" if r.get("device_note") else "")]
    for b in r["buckets"]:
        lines.append(f"  {b['id']}: {b['compiles']} compile(s), {b['cache_hits']} cache hit(s); first call "
                     f"{b['first_call_s'] * 1000:.1f} ms, steady {b['steady_call_s'] * 1000:.3f} ms")
    lines.append("no bucket compiled anything" if r["zero_compiles"] else
                 f"{r['compiles_total']} compile(s): the pulled caches do not cover these buckets and settings")
    return "\n".join(lines)


@command("warmup")
def cmd_warmup(args) -> int:
    """Warm the release in ``args.dir`` and report per bucket."""
    if args.in_process:
        from neuron_build.runtime import warmup

        report = warmup(args.dir, factory_root=args.factory_root)
    else:
        from neuron_build.release.warmup import run_fresh

        report = run_fresh(args.dir, args.factory_root)
    report = {"schema": SCHEMA, **{k: v for k, v in report.items() if k != "schema"}}
    if args.json:
        print_json(report)
    else:
        display_text(format_report(report))
    return ExitCode.OK if report["zero_compiles"] or args.in_process else ExitCode.FAILED


__all__ = ["SCHEMA", "cmd_warmup", "format_report", "register"]
