"""Copying between two stores of the shared layout: what ``push``, ``fetch`` and the read-through do.

Every copy keeps the publish order of the contract: the blobs of an artifact first (create-only, each one
verified by its sha256 on the way), its manifest last, so a copy killed at any point leaves the
destination without that artifact rather than with a torn one, and the next copy finishes the job.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.store.contract import ArtifactStore
from neuron_build.store.layout import log_path


@dataclass
class SyncReport:
    """What one copy did.

    Attributes:
        copied: keys whose artifact the destination did not have and now has.
        present: keys the destination already held complete (nothing copied).
        failed: (key, one-line reason) of keys that could not be copied; the destination has no manifest
            for them (they are retried by the next copy).
        blobs: blobs written; ``bytes``: their total size in bytes.
        records: target records, results and release records copied.
    """

    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    blobs: int = 0
    bytes: int = 0
    records: int = 0

    def to_json(self) -> dict[str, Any]:
        """The report as the ``--json`` of push and fetch print it (sizes in bytes)."""
        return {"copied": self.copied, "present": self.present,
                "failed": [{"key": k, "reason": r} for k, r in self.failed],
                "blobs": self.blobs, "bytes": self.bytes, "records": self.records}


def _entries(raw: dict[str, Any]) -> list[tuple[str, int]]:
    """(sha256, size) of every blob a raw manifest's ``files`` names."""
    out = []
    for ent in (raw.get("files") or {}).values():
        if isinstance(ent, dict) and isinstance(ent.get("sha256"), str):
            out.append((ent["sha256"], int(ent.get("size", -1))))
    return out


def copy_blob(src: ArtifactStore, dst: ArtifactStore, sha256: str, scratch: Path) -> int:
    """Copy one blob from ``src`` to ``dst`` through a local scratch file (digest verified on the way in
    by ``src.get_blob`` and again by ``dst.put_blob``).

    Returns:
        Bytes written to ``dst`` (0 when ``dst`` kept an intact copy it had).

    Raises:
        FileNotFoundError: ``src`` has no such blob; ValueError: its bytes do not match ``sha256``;
        OSError or a store error: a transfer failed.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{sha256[:12]}.", dir=scratch)
    os.close(fd)
    path = Path(tmp)
    try:
        src.get_blob(sha256, path)
        size = path.stat().st_size
        return size if dst.put_blob(sha256, path) else 0
    finally:
        path.unlink(missing_ok=True)


def copy_key(src: ArtifactStore, dst: ArtifactStore, key: str, scratch: Path, report: SyncReport,
             heal: bool = False) -> bool:
    """Copy the artifact of ``key`` from ``src`` to ``dst`` unless ``dst`` holds it complete: its blobs
    (those ``dst`` lacks or holds with another size) first, its manifest last.

    With ``heal`` (a push right after a build) every blob is offered to ``dst.put_blob`` even when ``dst``
    looks complete, so a blob that rotted or was tampered with on ``dst`` is replaced by the rebuild's
    identical bytes (what heals a release pinning it).

    Returns:
        True when ``dst`` holds a complete artifact afterwards. Failures are added to ``report``; they
        never raise, so one bad key does not stop a push of many.
    """
    try:
        if not heal and dst.lookup(key).hit:
            report.present.append(key)
            return True
        raw = src.raw_manifest(key)
        if raw is None or not src.lookup(key).hit:
            report.failed.append((key, f"{src.location} holds no complete artifact for key {key[:16]}"))
            return False
        for sha, size in _entries(raw):
            if not heal and dst.blob_size(sha) == size:
                continue
            written = copy_blob(src, dst, sha, scratch)
            report.blobs += 1 if written else 0
            report.bytes += written
        for name in raw.get("logs") or {}:  # the build's logs: copied when there, never required
            log = src.get_object(log_path(key, name))
            if log is not None:
                dst.put_object(log_path(key, name), log)
        if not dst.put_manifest(key, raw) and heal:
            there = dst.lookup(key, deep=True)  # rare (another builder won, or a rebuild after damage)
            if there.hit:
                report.present.append(key)
                return True
            if there.damage is not None:  # the entry in the way pins a damaged blob: ours replaces it
                dst.quarantine(key, f"replaced by a verified push: {there.damage}")
                dst.put_manifest(key, raw)
        if not dst.lookup(key).hit:
            raise ValueError(f"the copy at {dst.location} does not verify")
    except FileNotFoundError as e:
        report.failed.append((key, f"a blob is missing in {src.location}: {e}"))
        return False
    except Exception as e:  # a store error, an OSError, a digest mismatch: the next copy retries
        report.failed.append((key, _one_line(e)))
        return False
    report.copied.append(key)
    return True


def copy_keys(src: ArtifactStore, dst: ArtifactStore, keys: Iterable[str]) -> SyncReport:
    """:func:`copy_key` for each of ``keys`` (deduplicated, in order)."""
    report = SyncReport()
    with tempfile.TemporaryDirectory(prefix="neuron-build-sync.") as scratch:
        for key in dict.fromkeys(keys):
            copy_key(src, dst, key, Path(scratch), report)
    return report


def copy_records(src: ArtifactStore, dst: ArtifactStore, keys: Iterable[str], report: SyncReport,
                 releases: bool = True) -> None:
    """Copy what describes the copied artifacts: the target records pointing at ``keys``, their
    validation and benchmark results, the graph index entries pointing at them, and (``releases``) every release record ``dst`` lacks (release
    records are written once: an existing one is never replaced)."""
    wanted = set(keys)
    for rec in src.all_targets():
        if rec.key in wanted:
            mine = dst.target(rec.target)
            if mine is None or mine.key != rec.key:
                dst.put_target(rec)
                report.records += 1
    for key in sorted(wanted):
        for kind in ("validation", "bench"):
            for name, result in src.results(key, kind).items():
                if dst.result(key, kind, name) != result:
                    dst.put_result(key, kind, name, result)
                    report.records += 1
    from neuron_build.store import graph_index
    from neuron_build.store.reads import add_recorded_reads, recorded_reads
    report.records += graph_index.copy_entries(src, dst, wanted)
    # what builds of each model recorded (imports, reads): the keys of the copied artifacts include them
    for model in sorted({m.model for m in (src.manifest(k) for k in wanted) if m is not None}):
        imports = src.recorded_imports(model)
        if imports and not set(imports) <= set(dst.recorded_imports(model)):
            dst.add_recorded_imports(model, imports)
            report.records += 1
        reads = recorded_reads(src, model)
        if any(reads.values()):
            had = recorded_reads(dst, model)
            if add_recorded_reads(dst, model, reads) != had:
                report.records += 1
    if releases:
        for model, rid, record in src.releases():
            if record is not None and dst.release(model, rid) is None and dst.put_release(model, rid, record):
                report.records += 1


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


__all__ = ["SyncReport", "copy_blob", "copy_key", "copy_keys", "copy_records"]
