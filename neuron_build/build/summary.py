"""The one summary a build prints at its end, for ``neuron-build build`` and ``doit build`` alike::

    3 targets: 2 built, 0 cached, 1 failed
      FAILED other/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose
        log: neuron-build show other/static/fp32/p1

Each failed target once, with its status, its one-line reason and the command that shows its log. On a
terminal (and with rich installed) the failures are a table instead; colour as
:func:`neuron_build.log.use_color` says.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from neuron_build.status import DOWNLOADED, TargetState, Verdict
from neuron_build.util import plural

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace

#: The reason of a failed target that left no outcome (its build did not run, or stopped before the end).
#: How a relink's outcome reason starts (:data:`neuron_build.build.graph.relink.RELINKED`; not imported: the
#: no-op build's summary stays clear of the graph wing).
RELINKED = "weights changed, graph unchanged"
NOT_RUN = "the build stopped before this target finished (see the errors above)"


#: Statuses of a target that never ran to an end (no log to show: ``neuron-build show`` would say "not built").
UNFINISHED = ("INTERRUPTED", "not built")


def log_command(target_id: str) -> str:
    """The command that shows a failed target's status, reason and log file: ``neuron-build show <id>``."""
    return f"neuron-build show {target_id}"


@dataclass
class BuildSummary:
    """What one build did to the chosen targets (lists of target ids, in matrix order).

    ``failures``: target id -> (status, one-line reason) of each failed target.
    """

    targets: list[str]
    built: list[str]      # in the store now, not before, and compiled here (or by doit's other runners)
    reused: list[str]     # compiled by another builder while this one waited for the key's lock
    failed: list[str]     # not in the store after the build
    failures: dict[str, tuple[str, str]] = field(default_factory=dict)
    downloaded: list[str] = field(default_factory=list)  # cached: fetched from [build] remote by this build
    rows: list[dict] = field(default_factory=list)   # build --json: one object per target (see of)
    graph_reused: list[str] = field(default_factory=list)  # source changed, graph unchanged: nothing compiled
    relinked: list[str] = field(default_factory=list)  # of graph_reused: new weights, the stored compiled files
    #: target id -> why its stored artifact was checked again (recorded inputs that changed), failed ones aside
    rechecked: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, ws: Workspace, chosen: Sequence[Any], before: Mapping[str, str],
           outcomes: Mapping[str, Any]) -> BuildSummary:
        """Compare each chosen target's state before and after a build, with the Outcomes of this run.

        Args:
            ws: the build's opened project (:class:`~neuron_build.workspace.Workspace`: ``state``, ``key``, ``store``).
            chosen: the targets the build selected, in matrix order.
            before: target id -> its :class:`~neuron_build.status.TargetState` before the build.
            outcomes: target id -> :class:`~neuron_build.build.attempt.Outcome` of each build that ran.

        ``rows`` (``build --json``), one per chosen target in matrix order: ``target``, ``key``, ``result``
        (``built``, ``cached``, ``reused``: built by another builder meanwhile, ``graph-reused``: the source
        changed, the graph did not, nothing compiled, ``failed``), ``status`` (the
        compile's :class:`~neuron_build.status.Status`, or ``cached``), ``verdict`` (``pass``: the store holds
        it; ``fail``), ``reason`` (one line; empty unless failed), ``compile_time_s`` (seconds of this
        build's compile, or of the stored artifact's for a cached one; None when failed before compiling),
        ``rechecked`` (why its stored artifact was checked again: the recorded inputs that changed, e.g.
        ``package pillow 10.0 -> 11.0``; empty when it was not) and ``log`` (for a failure: the command that
        shows its log)."""
        ids = [t.id for t in chosen]
        # an ok outcome of this run holds its artifact, even one whose record is incomplete (never a hit
        # later: ``plan`` says missing, and the next build builds it again)
        after = {t.id: TargetState.CACHED if t.id in outcomes and outcomes[t.id].ok else ws.state(t)
                 for t in chosen}

        def said(start: str, exact: bool = False) -> list[str]:
            return [t for t in ids if t in outcomes
                    and (outcomes[t].reason == start if exact else outcomes[t].reason.startswith(start))]

        built = [t for t in ids if after[t] == TargetState.CACHED
                 and (outcomes[t].compiled if t in outcomes else before[t] != TargetState.CACHED)]
        failed = [t for t in ids if after[t] != TargetState.CACHED]
        failures = {t: _failure(ws.store, t, outcomes.get(t)) for t in failed}
        relinked = said(RELINKED)
        out = cls(ids, built, said("reused"), failed, failures, said(DOWNLOADED, exact=True),
                  graph_reused=[t for t in ids if t in relinked or t in said("graph unchanged")], relinked=relinked,
                  rechecked=_rechecked(ids, outcomes, failed))
        out.rows = [out._row(ws, t, outcomes.get(t.id)) for t in chosen]
        return out

    def _row(self, ws: Workspace, target: Any, outcome: Any) -> dict[str, Any]:
        """The ``build --json`` object of one target (see :meth:`of`)."""
        tid, key = target.id, ws.key(target).key
        result = ("failed" if tid in self.failed else "reused" if tid in self.reused else "built"
                  if tid in self.built else "graph-reused" if tid in self.graph_reused else "cached")
        if outcome is not None:
            status, reason = str(outcome.status), outcome.reason
            ct = (outcome.metrics or {}).get("compile_time_s")
        else:
            (status, reason), ct = self.failures.get(tid, ("cached", "")), None
        if result == "cached" or (result == "reused" and ct is None):
            m = ws.store.manifest(key)
            ct = m.metrics.compile_time_s if m else None
        row = {"target": tid, "key": key, "result": result, "status": status,
               "verdict": Verdict.of(result != "failed"), "reason": reason if result == "failed" else "",
               "compile_time_s": None if ct is None else round(float(ct), 3),
               "rechecked": list(self.rechecked.get(tid, ()))}
        if result == "failed":
            row["log"] = log_command(tid)
        return row

    @property
    def cached(self) -> int:
        """Targets that were in the store already (or built by another builder meanwhile)."""
        return len(self.targets) - len(self.built) - len(self.failed)

    @property
    def lines(self) -> list[str]:
        """Two lines per failed target: ``  FAILED <target>: <status>: <reason>``, ``    log: <command>`` (not for
        a target that never finished: :data:`UNFINISHED`)."""
        out = []
        for tid in self.failed:
            status, reason = self.failures.get(tid, ("not built", NOT_RUN))
            out += [f"  FAILED {tid}: {status}: {reason}"] + (
                [] if status in UNFINISHED else [f"    log: {log_command(tid)}"])
        return out

    def head(self) -> str:
        """``3 targets: 2 built, 0 cached, 1 failed`` (with the reused and downloaded counts when any)."""
        return (f"{plural(len(self.targets), 'target')}: {len(self.built)} built, {self.cached} cached"
                + (f" ({len(self.reused)} built by another builder meanwhile)" if self.reused else "")
                + (f" ({len(self.downloaded)} downloaded from the remote store)" if self.downloaded else "")
                + (f" ({len(self.relinked)} relinked with new weights)" if self.relinked else "")
                + f", {len(self.failed)} failed")

    def recheck_line(self) -> str | None:
        """``  8 targets re-checked because package pillow 10.0 -> 11.0: 8 unchanged (nothing compiled)``:
        the targets whose stored artifact was checked again because a recorded input changed (counted as
        cached when nothing compiled, so said here), each reason once; None when there are none."""
        if not self.rechecked:
            return None
        reasons = list(dict.fromkeys(r for why in self.rechecked.values() for r in why))
        said = ", ".join(reasons[:3]) + (f" and {len(reasons) - 3} more" if len(reasons) > 3 else "")
        compiled = sum(1 for t in self.rechecked if t in self.built)
        relinked = sum(1 for t in self.rechecked if t in self.relinked)
        same = len(self.rechecked) - compiled - relinked
        parts = ([f"{same} unchanged (nothing compiled)"] if same else []) + (
            [f"{relinked} relinked (new weights, nothing compiled)"] if relinked else []) + (
            [f"{compiled} compiled"] if compiled else [])
        return f"  {plural(len(self.rechecked), 'target')} re-checked because {said}: {', '.join(parts)}"

    def text(self) -> str:
        """The summary as plain text (a blank line first, to set it off doit's report)."""
        recheck = self.recheck_line()
        return "\n".join(["\n" + self.head(), *([recheck] if recheck else []), *self.lines])

    def print(self, stream: Any = None, rich: bool | None = None, width: int | None = None) -> None:
        """Print the summary on ``stream`` (default stdout): plain :meth:`text`, or with ``rich`` (default:
        when something failed, ``stream`` is a terminal and rich is installed: never on a no-op build) the
        head line and a table of the failures (target, status, then the reason with the command showing the
        log on the line below it), ``width`` columns wide (default: the terminal's)."""
        from neuron_build.build.display import make_console, wants_live

        s = sys.stdout if stream is None else stream
        if not (bool(self.failed) and wants_live(s) if rich is None else rich):
            print(self.text(), file=s, flush=True)
            return
        from rich.table import Table
        from rich.text import Text

        console = make_console(s, terminal=True if rich else None, width=width)
        console.print()
        console.print(Text(self.head(), style="bold red" if self.failed else "bold green"))
        if self.recheck_line():
            console.print(Text(self.recheck_line() or "", style="yellow"))
        if self.failed:
            # the reason gets the room (an 80-column terminal included), the command showing the log goes
            # on the line below it, whole: ids and commands never fold mid-word while there is room
            table = Table(show_edge=False, pad_edge=False, header_style="bold")
            table.add_column("failed target", overflow="fold", no_wrap=True)
            table.add_column("status", no_wrap=True)
            table.add_column("reason and log", overflow="fold", ratio=1)
            for tid in self.failed:
                status, reason = self.failures.get(tid, ("not built", NOT_RUN))
                cell = Text(reason)
                if status not in UNFINISHED:
                    cell.append(("\n" if reason else "") + f"log: {log_command(tid)}", style="dim")
                table.add_row(tid, Text(status, style="red"), cell)
            console.print(table)


def from_outcomes(targets: Iterable[str], outcomes: Mapping[str, Any], hits: Iterable[str] = (),
                  reported: Mapping[str, str | None] | None = None, interrupted: bool = False) -> BuildSummary:
    """The summary of a ``doit build`` from what its session saw, without reading the store.

    Args:
        targets: the target ids the build selected, in matrix order.
        outcomes: target id -> :class:`~neuron_build.build.attempt.Outcome` of each build that ran.
        hits: target ids doit found up to date (cached).
        reported: target id -> None (passed) or doit's failure message, for builds that ran where the
            session could not see their outcome (a ``doit -P process`` runner).

    A selected target with neither an outcome, a hit nor a report did not run or did not finish: it
    counts as failed, ``INTERRUPTED`` when ``interrupted`` (Ctrl-C stopped the build), else ``not built``
    (doit stopped first).
    """
    ids, hit, rep = list(targets), set(hits), dict(reported or {})
    outcomes = dict(outcomes)
    for t, msg in rep.items():  # seen by doit only: a pass counts as built, a failure keeps doit's message
        if t not in outcomes and t not in hit:
            outcomes[t] = _Reported(t, msg)
    built = [t for t in ids if t in outcomes and outcomes[t].ok and outcomes[t].compiled]
    reused = [t for t in ids if t in outcomes and outcomes[t].ok and outcomes[t].reason.startswith("reused")]
    relinked = [t for t in ids if t in outcomes and outcomes[t].ok and outcomes[t].reason.startswith(RELINKED)]
    downloaded = [t for t in ids if t in outcomes and outcomes[t].ok and outcomes[t].reason == DOWNLOADED]
    failed = [t for t in ids if (t in outcomes and not outcomes[t].ok) or (t not in outcomes and t not in hit)]
    unfinished = (("INTERRUPTED", "Ctrl-C stopped the build before it finished") if interrupted
                  else ("not built", NOT_RUN))
    failures = {t: (str(outcomes[t].status), outcomes[t].reason) if t in outcomes else unfinished
                for t in failed}
    return BuildSummary(ids, built, reused, failed, failures, downloaded, relinked=relinked,
                        rechecked=_rechecked(ids, outcomes, failed))


def _rechecked(ids: Iterable[str], outcomes: Mapping[str, Any], failed: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """target id -> its outcome's ``rechecked`` (why it was checked again), for the targets not ``failed``."""
    bad = set(failed)
    return {t: tuple(outcomes[t].rechecked) for t in ids
            if t in outcomes and t not in bad and getattr(outcomes[t], "rechecked", ())}


def why_rechecked(stale: Iterable[str], recorded: Any, version: Any) -> tuple[str, ...]:
    """The reasons a stored artifact was checked again, for the summary: ``stale`` (the lines of
    :meth:`~neuron_build.project.reads.InputCheck.stale`) with each changed distribution said with its
    versions, ``package pillow 10.0 -> 11.0`` (the recorded one from ``recorded``, a manifest's
    ``recorded_inputs``; the installed one from ``version(name)``, None: ``removed``).

    >>> why_rechecked(["recorded distribution pillow changed", "recorded read w.bin changed"],
    ...               {"dists": {"pillow": "10.0"}}, lambda name: "11.0")
    ('package pillow 10.0 -> 11.0', 'recorded read w.bin changed')
    """
    word = "recorded distribution "
    dists = recorded.get("dists") if isinstance(recorded, dict) else None
    out = []
    for line in stale:
        name = line[len(word):-len(" changed")] if line.startswith(word) and line.endswith(" changed") else None
        if name is None or not isinstance(dists, dict):
            out.append(line)
            continue
        now = version(name)
        out.append(f"package {name} {dists.get(name) or 'none'} -> {now if now is not None else 'removed'}")
    return tuple(out)


@dataclass(frozen=True)
class _Reported:
    """An outcome known only from doit's report: passed (``msg`` None) or failed with doit's message."""

    target: str
    msg: str | None

    @property
    def ok(self) -> bool:
        return self.msg is None

    compiled = True

    def _parts(self) -> tuple[str, str]:
        """(status, reason) from doit's message, ``<target>: <status>: <reason>`` as the build task words it."""
        text = (self.msg or "").strip()
        text = text[len(self.target) + 2:] if text.startswith(f"{self.target}: ") else text
        status, sep, reason = text.partition(": ")
        return (status, reason) if sep and status.isupper() else ("FAILED", text)

    @property
    def status(self) -> str:
        return "PASS" if self.msg is None else self._parts()[0]

    @property
    def reason(self) -> str:
        return "" if self.msg is None else self._parts()[1]


def _failure(store: Any, target_id: str, outcome: Any) -> tuple[str, str]:
    """(status, reason) of a target not in the store after a build: its failed outcome's, else its failure
    record's, else (``not built``, :data:`NOT_RUN`)."""
    if outcome is not None and not outcome.ok:
        return str(outcome.status), outcome.reason
    f = store.failure(target_id)
    return (str(f.status), f.reason) if f else ("not built", NOT_RUN)


def reported_outcome(target_id: str, msg: str | None) -> Any:
    """An outcome known only from doit's report of a ``build:`` task: passed (``msg`` None) or failed with
    doit's message (``<target>: <status>: <reason>``): ``target``, ``ok``, ``compiled``, ``status``,
    ``reason`` as an :class:`~neuron_build.build.attempt.Outcome` has them."""
    return _Reported(target_id, msg)


__all__ = ["BuildSummary", "from_outcomes", "log_command", "reported_outcome", "why_rechecked"]
