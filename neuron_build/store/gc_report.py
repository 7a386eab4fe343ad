"""What :mod:`neuron_build.store.gc` plans and reports: removals, what could not be removed, the report
and the plan, shared by the collector of every store and the folder store's local part."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DAY_S = 86400.0
#: Temporary files (``.<name>.<pid>.<token>.tmp``) live milliseconds; ones older than this were left by a
#: killed process. Blobs that no manifest lists yet are kept this long too (a build may be publishing them).
TMP_MAX_AGE_S = 3600.0


@dataclass
class Removal:
    """One thing ``gc`` removes (or would remove, on a dry run): ``kind`` is ``object`` (a manifest with
    its logs, view and results), ``blob``, ``view``, ``logs``, ``staging``, ``quarantine``, ``lock``,
    ``temp`` or ``failure-workdir``; ``bytes`` its size; ``why`` one line."""

    kind: str
    path: str
    bytes: int
    why: str
    key: str | None = None
    target: str | None = None


@dataclass
class Unremoved:
    """Something ``gc`` meant to remove and could not (``error``: the reason), or a file it found outside
    the layout and left (``kind`` ``unknown``: gc never deletes what it did not write)."""

    kind: str
    path: str
    error: str


@dataclass
class GcReport:
    """What ``gc`` removed (or would remove), what it could not remove (``failed``: exit status 1) and
    what it left because it did not write it (``unknown``). ``referenced`` counts the keys kept as roots;
    ``reused`` the planned blobs put back because a publish reused them meanwhile."""

    dry_run: bool
    keep_days: float
    referenced: int = 0
    kept_young: int = 0
    removed: list[Removal] = field(default_factory=list)
    failed: list[Unremoved] = field(default_factory=list)
    unknown: list[Unremoved] = field(default_factory=list)
    reused: int = 0

    @property
    def bytes_freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "keep_days": self.keep_days, "referenced": self.referenced,
                "kept_young": self.kept_young, "bytes_freed": self.bytes_freed,
                "removed": [asdict(r) for r in self.removed], "failed": [asdict(f) for f in self.failed],
                "unknown": [asdict(u) for u in self.unknown]}


@dataclass
class GcPlan:
    """What :func:`apply_gc` removes: ``report`` (its ``removed`` is the plan), the keys seen in the action
    cache when planning, the planned manifests, per-key extras (logs, results objects), blobs (sha256 ->
    the age in seconds they must still have when applied) and a folder store's local leftovers."""

    report: GcReport
    seen: set[str] = field(default_factory=set)
    manifests: list[tuple[str, Removal]] = field(default_factory=list)
    extras: dict[str, list[str]] = field(default_factory=dict)
    blobs: list[tuple[str, float, Removal]] = field(default_factory=list)
    local: list[Any] = field(default_factory=list)
    window: float = 0.0


__all__ = ["DAY_S", "TMP_MAX_AGE_S", "GcPlan", "GcReport", "Removal", "Unremoved"]
