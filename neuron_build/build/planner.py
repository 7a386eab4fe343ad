"""Planning a build: the targets of the matrix, their keys, their state in the store, what changed since
they were last built, and the worker request of a target. Reads the store, never writes it."""

from __future__ import annotations

from pathlib import Path

from neuron_build.compilers.base import CompileRequest
from neuron_build.project.config import Project
from neuron_build.project.keys import KeyInfo, KeyMaker, diff_components
from neuron_build.project.matrix import Target, expand
from neuron_build.status import TargetState
from neuron_build.store.contract import ArtifactStore


class Planner:
    """The targets of one project and their keys, against one store.

    Args:
        project: the loaded config.
        store: the project's store.
        backend: override ``[build] backend`` (tests, CLI).

    Attributes:
        keys: the project's :class:`~neuron_build.project.keys.KeyMaker`.
        targets: the expanded matrix, in order.
        by_id: target id -> target.
    """

    def __init__(self, project: Project, store: ArtifactStore, backend: str | None = None):
        self.project = project
        self.store = store
        self.keys = KeyMaker(project, backend=backend)
        self.targets = expand(project)
        self.by_id = {t.id: t for t in self.targets}
        self._keyinfo: dict[str, KeyInfo] = {}

    def key(self, target: Target) -> KeyInfo:
        """The target's key (computed once per planner)."""
        ki = self._keyinfo.get(target.id)
        if ki is None:
            ki = self._keyinfo[target.id] = self.keys.key(target)
        return ki

    def state(self, target: Target) -> TargetState:
        """``cached`` (a complete artifact for the current key), ``failed`` (the last compile of the current
        key failed; it will be retried) or ``missing``."""
        key = self.key(target).key
        if self.store.lookup(key).hit:  # reads only: plan and show never move a damaged object
            return TargetState.CACHED
        fail = self.store.failure(target.id)
        return TargetState.FAILED if fail and fail.key == key else TargetState.MISSING

    def changed(self, target: Target) -> tuple[list[str], str | None]:
        """What changed since the target was last built: (components with sub-keys, compared-with id).

        For a target never built (e.g. a new bucket value), the comparison is with the most similar
        recorded target of the same model, dtype and profile that is no longer in the matrix.
        """
        ki = self.key(target)
        rec = self.store.target(target.id)
        if rec and rec.details is not None:
            return ([] if rec.key == ki.key else diff_components(rec.details, ki.details)), target.id
        best: tuple[int, list[str], str] | None = None
        for r in self.store.targets(target.model):
            tid = r.target
            if tid in self.by_id or r.details is None:
                continue
            parts = tid.split("/")
            if len(parts) != 4 or parts[2] != target.dtype or parts[3] != target.profile:
                continue
            diff = diff_components(r.details, ki.details)
            if best is None or len(diff) < best[0]:
                best = (len(diff), diff, tid)
        if best is None:
            return ["new target"], None
        return best[1], best[2]

    def request(self, target: Target, ki: KeyInfo, out_dir: Path | str, work_dir: Path | str) -> CompileRequest:
        """The worker request for a target: the artifact's files go to ``out_dir``, the compiler works in
        ``work_dir`` (both as the worker sees them)."""
        cfg = self.project.config
        m, prof = cfg.models[target.model], cfg.profiles[target.profile]
        return CompileRequest(
            target=target.id, key=ki.key, root=str(self.project.root), factory=m.factory, kwargs=dict(m.kwargs),
            dtype=target.dtype, inputs=ki.details["inputs"]["inputs"], backend=self.keys.backend,
            hardware_target=self.keys.hardware_target, compiler_args=list(prof.compiler_args),
            inline_weights_to_neff=prof.inline_weights_to_neff, tp_degree=prof.tp_degree,
            out_dir=str(out_dir), work_dir=str(work_dir), seed=int(ki.key[:8], 16))


__all__ = ["Planner"]
