"""Build the chosen targets on either executor and gather what the end of a build reports, the same way
for both: ``neuron-build build`` runs :func:`build_targets` with a
:class:`~neuron_build.build.doit.session.SessionExecutor` (doit on this host) or a
:class:`~neuron_build.build.fleet.dask_executor.DaskBuild` (one Dask task per target), then prints the
:class:`TargetsBuilt` (text, or ``--json``).

An executor here is anything with ``run(targets) -> {target id: Outcome}``; it may say doit's exit status
(``status``) and the Dask worker of each target (``workers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from neuron_build.build.summary import BuildSummary
from neuron_build.status import Verdict

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace

__all__ = ["TargetExecutor", "TargetsBuilt", "build_targets"]


class TargetExecutor(Protocol):
    """Where the compiles of a build run: ``run`` builds every target of ``targets`` the store lacks and
    returns target id -> :class:`~neuron_build.build.attempt.Outcome` of each build that ran."""

    def run(self, targets: Sequence[Any]) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class TargetsBuilt:
    """What one build did, as its end reports it.

    Attributes:
        summary: the chosen targets' results (:class:`~neuron_build.build.summary.BuildSummary`).
        not_pushed: (key, one-line reason) of each artifact this build could not push to the remote store
            (built now or left pending by an earlier build), first failure first; empty without a remote.
        status: doit's exit status for a build on this host (0 ok); always 0 on Dask.
        workers: target id -> address of the Dask worker that built it (empty on this host).
    """

    summary: BuildSummary
    not_pushed: list[tuple[str, str]] = field(default_factory=list)
    status: int = 0
    workers: Mapping[str, str] = field(default_factory=dict)

    @property
    def unpushed_keys(self) -> list[str]:
        """The keys of :attr:`not_pushed`, each once, in the order they failed."""
        return list(dict.fromkeys(k for k, _ in self.not_pushed))

    @property
    def ok(self) -> bool:
        """Every chosen target is in the store, every push went up and doit reported no failure."""
        return not (self.summary.failed or self.not_pushed or self.status != 0)

    def per_worker(self) -> dict[str, int]:
        """Dask worker address -> how many of the built targets it compiled (empty on this host)."""
        out: dict[str, int] = {}
        for tid in self.summary.built:
            w = self.workers.get(tid)
            if w:
                out[w] = out.get(w, 0) + 1
        return out

    def doc(self) -> dict[str, Any]:
        """The ``build --json`` document (``docs/schemas/build.json``, without its ``schema`` field):
        ``targets`` (the summary's rows), the ``built``, ``cached``, ``graph_reused`` and ``failed`` counts,
        ``not_pushed`` (sorted keys) and ``verdict`` (``pass`` when :attr:`ok`)."""
        s = self.summary
        return {"targets": s.rows, "built": len(s.built), "cached": s.cached, "graph_reused": len(s.graph_reused),
                "failed": len(s.failed), "not_pushed": sorted(set(self.unpushed_keys)),
                "verdict": Verdict.of(self.ok)}


def build_targets(ws: Workspace, chosen: Sequence[Any], executor: TargetExecutor,
                  before: Mapping[str, str] | None = None) -> TargetsBuilt:
    """Build ``chosen`` (targets, in matrix order) with ``executor`` and return what the build did.

    ``before``: target id -> state before the build, when the caller has read it already (else read here).
    The pushes that failed are every one the workspace's store saw fail in this process (each executor
    retries those earlier builds left pending first: the session's ``(push)`` task, ``DaskBuild.run``).
    """
    if before is None:
        before = {t.id: ws.state(t) for t in chosen}
    outcomes = executor.run(chosen)
    summary = BuildSummary.of(ws, chosen, before, outcomes)
    return TargetsBuilt(summary, list(ws.store.push_failures), int(getattr(executor, "status", 0)),
                    dict(getattr(executor, "workers", {}) or {}))
