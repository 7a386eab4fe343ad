"""``neuron-build build [-n N] [--no-retry-failed] [PATTERN...]``: compile what the store lacks, through doit.

Exit status: 0 when every selected target is in the store, 1 when one failed, 2 for a user error.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from neuron_build.cli.app import command, open_builder, plural
from neuron_build.errors import BuildFailed, ExitCode
from neuron_build.status import DOWNLOADED, TargetState


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 or more")
    return value


def register(add) -> None:
    """Add the ``build`` sub-command."""
    s = add("build", "compile the targets that are not in the store")
    s.add_argument("-n", "--jobs", type=_positive_int, default=None,
                   help="compiles to run at once (default: one per CPU, bounded by the host-memory budget)")
    s.add_argument("--no-retry-failed", action="store_true",
                   help="skip targets whose current key failed last time (default: retry them)")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names")


@dataclass
class BuildSummary:
    """What one ``build`` did to the chosen targets (lists of target ids, in matrix order)."""

    targets: list[str]
    built: list[str]      # in the store now, not before, and compiled here (or by doit's other runners)
    reused: list[str]     # compiled by another builder while this one waited for the key's lock
    failed: list[str]     # not in the store after the build
    lines: list[str]      # one "FAILED <target>: <status>: <reason>" line per failed target
    downloaded: list[str] = field(default_factory=list)  # cached: fetched from [build] remote by this build

    @property
    def cached(self) -> int:
        """Targets that were in the store already (or built by another builder meanwhile)."""
        return len(self.targets) - len(self.built) - len(self.failed)

    def text(self) -> str:
        """The summary ``build`` prints after doit's output."""
        head = (f"\n{plural(len(self.targets), 'target')}: {len(self.built)} built, {self.cached} cached"
                + (f" ({len(self.reused)} built by another builder meanwhile)" if self.reused else "")
                + (f" ({len(self.downloaded)} downloaded from the remote store)" if self.downloaded else "")
                + f", {len(self.failed)} failed")
        return "\n".join([head, *self.lines])


def summarize(b, chosen, before: dict, outcomes: dict) -> BuildSummary:
    """Compare each chosen target's state before and after the build, with the Outcomes of this run."""
    after = {t.id: b.state(t) for t in chosen}
    built = [t.id for t in chosen if after[t.id] == TargetState.CACHED
             and (outcomes[t.id].compiled if t.id in outcomes else before[t.id] != TargetState.CACHED)]
    reused = [t.id for t in chosen if t.id in outcomes and outcomes[t.id].reason.startswith("reused")]
    downloaded = [t.id for t in chosen if t.id in outcomes and outcomes[t.id].reason == DOWNLOADED]
    failed = [t.id for t in chosen if after[t.id] != TargetState.CACHED]
    lines = []
    for tid in failed:
        o = outcomes.get(tid)
        if o is not None and not o.ok:
            lines.append(f"  FAILED {tid}: {o.status}: {o.reason}")
        else:
            f = b.store.failure(tid)
            lines.append(f"  FAILED {tid}: {f.status if f else 'not built'}: {f.reason if f else ''}")
    return BuildSummary([t.id for t in chosen], built, reused, failed, lines, downloaded)


@command("build")
def cmd_build(args) -> int:
    """Compile the targets matching PATTERNs (default: all) through doit."""
    from neuron_build.project.matrix import select
    from neuron_build.tasks import BuildSession

    b = open_builder(args)
    chosen = select(b.targets, args.patterns)
    before = {t.id: b.state(t) for t in chosen}
    b.keys.save()
    session = BuildSession(b, retry_failed=not args.no_retry_failed)
    todo = sum(before[t.id] != TargetState.CACHED for t in chosen)
    jobs = args.jobs or min(b.default_jobs(), max(1, todo))  # no runner threads for nothing to do
    rc = session.run([t.id for t in chosen] if args.patterns else None, jobs=jobs)
    summary = summarize(b, chosen, before, session.outcomes)
    print(summary.text())
    unpushed = [k for k, _ in getattr(b.store, "push_failures", ())]
    if unpushed:
        print(f"  NOT PUSHED {plural(len(set(unpushed)), 'artifact')} to {b.store.remote_location}: "
              f"{b.store.push_failures[0][1]}; they stay in the local store and the next build (or "
              "`neuron-build push`) pushes them")
    if summary.failed:
        raise BuildFailed(f"{len(summary.failed)} target(s) failed")
    if unpushed:
        raise BuildFailed(f"the push to {b.store.remote_location} failed")
    if rc != 0:
        raise BuildFailed("doit reported a failure")
    return ExitCode.OK
