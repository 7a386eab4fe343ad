"""An opened project: the targets of its matrix, their keys, their state in its store, what changed since
they were last built, where their artifacts are, and the build's predictor. Reads the store, never writes it.

Its own layer over project and store (``tests/test_layers.py``): no compilers and nothing of ``build/``, so
the read commands (``plan``, ``explain``, ``show``, ``ls``, the release commands) open a :class:`Workspace`
and never a :class:`~neuron_build.build.builder.Builder` (which takes one: it builds one target at a time),
and ``release/`` may take one. The shape of doit's loader/runner split: the loaded project here, the run of
it in ``build/``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from neuron_build.project.config import Project
from neuron_build.project.keys import COMPONENTS, KeyInfo, KeyMaker, diff_components
from neuron_build.project.matrix import Target, expand
from neuron_build.status import TargetState
from neuron_build.store import cached_store
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.records import TargetRecord
from neuron_build.util import canonical_json, sha256_hex

P = TypeVar("P")


class Workspace:
    """One project opened against one store: its targets and their keys.

    Args:
        project: the loaded config.
        store: the store to read (and, for a Builder, to build into); default the project's
            (``cached_store(...)`` of ``[build] store`` and ``remote``). A Dask worker passes the shared store
            it opened from the client's location.
        backend: override ``[build] backend`` (tests, CLI).

    Attributes:
        project: the loaded config.
        store: the opened store.
        keys: the project's :class:`~neuron_build.project.keys.KeyMaker`.
        targets: the expanded matrix, in order.
        by_id: target id -> target.
    """

    def __init__(self, project: Project, store: ArtifactStore | None = None, backend: str | None = None):
        self.project = project
        self.store = store if store is not None else cached_store(project.store_url(), project.remote_url(),
                                                                 project.config.build.remote_options)
        self.keys = KeyMaker(project, backend=backend, exclude=(Path(project.store_url()),))
        self.targets = expand(project)
        self.by_id = {t.id: t for t in self.targets}
        self._keyinfo: dict[str, KeyInfo] = {}
        self._location: dict[str, str] = {}
        self._removed: dict[tuple[str, str, str], _RemovedIndex] = {}
        #: target id -> why the artifact its key names is stale (recorded inputs that changed)
        self._stale: dict[str, list[str]] = {}
        self._predictor: object | None = None

    def predictor(self, make: Callable[[ArtifactStore, int], P]) -> P:
        """The build's compile-time and peak-memory predictor of this store's ledger, made once per workspace
        by ``make(store, default_peak_bytes)`` (``build/fleet/predict.py:Predictor.from_store``: the fleet passes
        its factory in, so this layer imports nothing of ``build/``); the ledger of a build in progress is
        not re-read. ``default_peak_bytes``: ``[build] default_compile_memory_gb`` in bytes (1e9 per GB)."""
        if self._predictor is None:
            gb = float(self.project.config.build.default_compile_memory_gb)
            self._predictor = make(self.store, int(gb * 1e9))
        return self._predictor  # type: ignore[return-value]

    def key(self, target: Target) -> KeyInfo:
        """The target's key (computed once per workspace): the declared inputs only, before and after a
        build."""
        ki = self._keyinfo.get(target.id)
        if ki is None:
            ki = self._keyinfo[target.id] = self.keys.key(target)
        return ki

    def state(self, target: Target) -> TargetState:
        """``cached`` (a complete artifact for the current key whose recorded inputs all still match),
        ``failed`` (the last compile of the current key failed; it will be retried) or ``missing``
        (:meth:`stale` says why when an artifact is there but stale, or damaged)."""
        key = self.key(target).key
        found = self.store.lookup(key)  # reads only: plan and show never move a damaged object
        self._stale[target.id] = []
        if found.hit:
            stale = self.keys.rebuild_reasons(target.model, found.manifest.recorded_inputs)
            if not stale:
                self._location[key] = found.location or "local"
                return TargetState.CACHED
            self._stale[target.id] = stale
        elif found.damage is not None:  # a truncated or edited object: missing, and said so (plan, explain)
            self._stale[target.id] = [f"artifact damaged: {found.damage}; a build makes it again"]
        fail = self.store.failure(target.id)
        return TargetState.FAILED if fail and fail.key == key else TargetState.MISSING

    def stale(self, target: Target) -> list[str]:
        """Why the artifact of the target's key is stale, as :meth:`state` found it: one line per recorded
        input that changed (``recorded read models/w.safetensors changed``); empty otherwise."""
        return list(self._stale.get(target.id, []))

    def location(self, target: Target) -> str | None:
        """Where :meth:`state` found the target's artifact: ``local`` or ``remote`` (a read-through
        store's remote); None when it was not found (or :meth:`state` was not asked)."""
        return self._location.get(self.key(target).key)

    def changed(self, target: Target) -> tuple[list[str], str | None]:
        """What changed since the target was last built: (components with sub-keys, compared-with id).

        For a target never built (e.g. a new bucket value), the comparison is with the most similar
        recorded target of the same model, dtype and profile that is no longer in the matrix: the one with
        the fewest differing components, the first by target id among equals. The candidates are indexed
        once per (model, dtype, profile), so a plan of n new targets against m removed ones costs
        O(n + m), not O(n * m).
        """
        ki = self.key(target)
        rec = self.store.target(target.id)
        if rec and rec.details is not None:
            if rec.key == ki.key:
                if target.id not in self._stale:
                    self.state(target)
                return self.stale(target), target.id
            return diff_components(rec.details, ki.details, rec.hashes, ki.hashes), target.id
        group = (target.model, target.dtype, target.profile)
        idx = self._removed.get(group)
        if idx is None:
            self._index_removed(target.model)
            idx = self._removed.setdefault(group, _RemovedIndex())
        best = idx.closest(ki.hashes)
        if best is None:
            return ["new target"], None
        return diff_components(best.details, ki.details, best.hashes, ki.hashes), best.target

    def _index_removed(self, model: str) -> None:
        """Index the recorded targets of ``model`` that are no longer in the matrix, per (dtype, profile)."""
        for r in self.store.targets(model):
            tid = r.target
            if tid in self.by_id or r.details is None:
                continue
            parts = tid.split("/")
            if len(parts) != 4:
                continue
            self._removed.setdefault((model, parts[2], parts[3]), _RemovedIndex()).add(r)


class _RemovedIndex:
    """Recorded targets no longer in the matrix, found by the components they share with a new target.

    Each record is filed under every projection of its component hashes (the hashes of a subset of
    :data:`~neuron_build.project.keys.COMPONENTS`, 2**6 = 64 of them); the closest record to a new target
    is the first (by target id) under the largest subset whose projection it shares. Subsets are filed a
    size at a time, largest first, when a lookup first needs them. Adding is O(64) at most, a lookup
    O(64): independent of how many records there are.
    """

    def __init__(self) -> None:
        self._by_proj: dict[tuple[int, tuple[str, ...]], TargetRecord] = {}
        self._records: list[tuple[TargetRecord, tuple[str, ...]]] = []
        self._built: set[int] = set()  # levels (indices into _LEVELS) filed so far

    @staticmethod
    def _hashes(rec: TargetRecord) -> tuple[str, ...]:
        d, have = rec.details or {}, rec.hashes or {}
        return tuple(have[c] if isinstance(have.get(c), str) else sha256_hex(canonical_json(d.get(c)))
                     for c in COMPONENTS)

    def _file(self, rec: TargetRecord, h: tuple[str, ...], level: int) -> None:
        for mask, idx in _LEVELS[level]:
            proj = (mask, tuple([h[i] for i in idx]))
            have = self._by_proj.get(proj)
            if have is None or rec.target < have.target:
                self._by_proj[proj] = rec

    def add(self, rec: TargetRecord) -> None:
        h = self._hashes(rec)
        self._records.append((rec, h))
        for level in self._built:
            self._file(rec, h, level)

    def closest(self, hashes: dict[str, str]) -> TargetRecord | None:
        h = tuple(hashes[c] for c in COMPONENTS)
        for n, level in enumerate(_LEVELS):  # most shared components first
            if n not in self._built:  # filed on first need: after a bucket change, levels 0 and 1 answer
                self._built.add(n)
                for rec, rh in self._records:
                    self._file(rec, rh, n)
            found = [r for mask, idx in level if (r := self._by_proj.get((mask, tuple([h[i] for i in idx]))))]
            if found:
                return min(found, key=lambda r: r.target)
        return None


#: Every subset of the components as (bit mask, the indices it keeps), and grouped by size, largest first.
_SUBSETS = [(m, tuple(i for i in range(len(COMPONENTS)) if m >> i & 1)) for m in range(1 << len(COMPONENTS))]
_LEVELS = [[s for s in _SUBSETS if len(s[1]) == n] for n in range(len(COMPONENTS), -1, -1)]


__all__ = ["Workspace"]
