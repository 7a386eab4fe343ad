"""The typed records the store keeps beside its artifacts: what a target was last built with, and its
last failed compile. Each reads the JSON the store has always written (:meth:`from_json` tolerates a
record of another shape by returning None: a damaged record is a miss, never a crash) and writes it back
field for field, in the same order (:meth:`to_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_build.status import Status


def _is(raw: Any, **types: type | tuple[type, ...]) -> bool:
    return isinstance(raw, dict) and all(isinstance(raw.get(k), t) for k, t in types.items())


@dataclass(frozen=True)
class TargetRecord:
    """The key a target was last built (or looked up) with: ``targets/<target id>/last.json``.

    Attributes:
        target: the target id (``minilm/b8-s128/bf16/o2``).
        key: the artifact key (64 hex chars).
        status: :class:`~neuron_build.status.Status` of that build (PASS for a cache hit).
        details: the key details (one dict per key component), for ``explain`` and ``plan``.
        hashes: the sha256 of each key component.
        time: when it was recorded (ISO 8601, UTC).
    """

    target: str
    key: str
    status: str
    details: dict[str, Any] | None = None
    hashes: dict[str, str] = field(default_factory=dict)
    time: str = ""

    @classmethod
    def from_json(cls, raw: Any) -> TargetRecord | None:
        """The record in ``raw``, or None when ``raw`` is not one (no string ``key``)."""
        if not _is(raw, key=str):
            return None
        details = raw.get("details")
        return cls(target=str(raw.get("target", "")), key=raw["key"], status=str(raw.get("status", "")),
                   details=details if isinstance(details, dict) else None,
                   hashes=raw.get("hashes") if isinstance(raw.get("hashes"), dict) else {},
                   time=str(raw.get("time", "")))

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "key": self.key, "status": str(self.status), "details": self.details,
                "hashes": self.hashes, "time": self.time}


@dataclass(frozen=True)
class FailureRecord:
    """The last failed compile of a target: ``targets/<target id>/failure.json`` (its log beside it).

    Attributes:
        target, key: the target id and the key that failed.
        status: a non-PASS :class:`~neuron_build.status.Status`.
        reason: one line for the CLI.
        compile_time_s: wall time of the failed compile, seconds.
        peak_rss_bytes: peak resident memory of the compile's process tree, bytes.
        exit_code: the worker's exit status (None when no worker ran, or it was killed by a signal).
        attempts: attempts of the build that recorded it (transient retries included).
        attempts_total: failed attempts of this key over all builds (None: not counted).
        details: backend details (diagnostics, failure stage, ...).
        time: when it failed (ISO 8601, UTC).
    """

    target: str
    key: str
    status: str
    reason: str = ""
    compile_time_s: float = 0.0
    peak_rss_bytes: int = 0
    exit_code: int | None = None
    attempts: int = 1
    attempts_total: int | None = None
    details: dict[str, Any] = field(default_factory=dict)
    time: str = ""

    @classmethod
    def from_json(cls, raw: Any) -> FailureRecord | None:
        """The record in ``raw``, or None when ``raw`` is not one (no string ``key``)."""
        if not _is(raw, key=str):
            return None
        total = raw.get("attempts_total")
        return cls(target=str(raw.get("target", "")), key=raw["key"], status=str(raw.get("status", Status.ERROR)),
                   reason=str(raw.get("reason") or ""), compile_time_s=raw.get("compile_time_s") or 0.0,
                   peak_rss_bytes=raw.get("peak_rss_bytes") or 0, exit_code=raw.get("exit_code"),
                   attempts=raw.get("attempts") or 1, attempts_total=total if isinstance(total, int) else None,
                   details=raw.get("details") if isinstance(raw.get("details"), dict) else {},
                   time=str(raw.get("time", "")))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "key": self.key, "status": str(self.status),
                               "compile_time_s": self.compile_time_s, "peak_rss_bytes": self.peak_rss_bytes,
                               "exit_code": self.exit_code, "attempts": self.attempts, "reason": self.reason}
        if self.attempts_total is not None:
            out["attempts_total"] = self.attempts_total
        out.update(details=self.details, time=self.time)
        return out


__all__ = ["TargetRecord", "FailureRecord"]
