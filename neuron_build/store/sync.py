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

from neuron_build.errors import NeuronBuildError, StoreUnreachable
from neuron_build.store import layout
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.layout import log_path
from neuron_build.store.transfer import key_lock
from neuron_build.trust import name_problem, release_problem, target_id_problem


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
        unreachable: the reason a copy stopped because a store could not be reached (a connection
            error or a timeout after the client's retries), or None.
    """

    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    blobs: int = 0
    bytes: int = 0
    records: int = 0
    unreachable: str | None = None
    #: one line per channel whose pointer and history disagree between the two stores (nothing copied)
    disagree: list[str] = field(default_factory=list)
    #: digests of the blobs this copy already put in the destination (each blob goes once, however many
    #: artifacts name it)
    sent: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        """The report as the ``--json`` of push and fetch print it (sizes in bytes)."""
        out = {"copied": self.copied, "present": self.present,
               "failed": [{"key": k, "reason": r} for k, r in self.failed],
               "blobs": self.blobs, "bytes": self.bytes, "records": self.records}
        if self.disagree:
            out["channels_disagree"] = self.disagree
        return out


class TransferProgress:
    """What a long copy (push, fetch, pull) reports as it goes: this base reports nothing; the CLI's
    :class:`neuron_build.cli.transfer.TransferDisplay` draws it. Granularity is one file (one blob): a
    blob is copied by one contract call.
    """

    def begin(self, files: int, nbytes: int) -> None:
        """Called once before the first file: ``files`` files of ``nbytes`` bytes to copy in all."""

    def file(self, target: str, name: str, size: int, copied: bool) -> None:
        """Called after each file: ``name`` of ``target``'s artifact, ``size`` bytes; ``copied`` False
        when the destination held it already (nothing was transferred; not part of :meth:`begin`'s count)."""

    def end(self) -> None:
        """Called once after the last file (also when the copy stopped early)."""


def _entries(raw: dict[str, Any]) -> list[tuple[str, int]]:
    """(sha256, size) of every blob a raw manifest's ``files`` names."""
    return [(sha, size) for _, sha, size in _named_entries(raw)]


def _named_entries(raw: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(file name, sha256, size) of every blob a raw manifest's ``files`` names."""
    out = []
    for name, ent in (raw.get("files") or {}).items():
        if isinstance(ent, dict) and isinstance(ent.get("sha256"), str):
            out.append((str(name), ent["sha256"], int(ent.get("size", -1))))
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
        try:
            return size if dst.put_blob(sha256, path) else 0
        except Exception as e:  # name the side that failed: the upload, never "missing" in the source
            raise UploadFailed(f"upload of blob {sha256[:16]} to {dst.location}: {_one_line(e)}") from e
    finally:
        path.unlink(missing_ok=True)


class UploadFailed(NeuronBuildError):
    """Writing a blob to the destination of a copy failed (one line: which blob, where, why)."""


def copy_key(src: ArtifactStore, dst: ArtifactStore, key: str, scratch: Path, report: SyncReport,
             heal: bool = False, progress: TransferProgress | None = None, replace: bool = False) -> bool:
    """Copy the artifact of ``key`` from ``src`` to ``dst`` unless ``dst`` holds it complete: its blobs
    (those ``dst`` lacks or holds with another size) first, its manifest last.

    With ``heal`` (a push right after a build) every blob is offered to ``dst.put_blob`` even when ``dst``
    looks complete, so a blob that rotted or was tampered with on ``dst`` is replaced by the rebuild's
    identical bytes (what heals a release pinning it). With ``replace`` (a push of a rebuild of a stale
    artifact) ``dst``'s other manifest of ``key`` is replaced by ``src``'s.

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
        target = str(raw.get("target") or key[:16])
        for name, sha, size in _named_entries(raw):
            with key_lock(f"sent/{sha}"):  # a thread putting the same blob: wait for it, then skip it
                if sha in report.sent or (not heal and dst.blob_size(sha) == size):
                    if progress is not None:
                        progress.file(target, name, max(size, 0), False)
                    continue
                written = copy_blob(src, dst, sha, scratch)
                report.sent.add(sha)
            report.blobs += 1 if written else 0
            report.bytes += written
            if progress is not None:
                progress.file(target, name, written or max(size, 0), bool(written))
        for name in raw.get("logs") or {}:  # the build's logs: copied when there, never required
            log = src.get_object(log_path(key, name))
            if log is not None:
                dst.put_object(log_path(key, name), log)
        if replace and dst.raw_manifest(key) not in (None, raw):
            dst.put_manifest(key, raw, replace=True)
        elif not dst.put_manifest(key, raw) and heal:
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
        if isinstance(e.__cause__ if isinstance(e, UploadFailed) else e, StoreUnreachable):
            report.unreachable = report.unreachable or _one_line(e)
        return False
    report.copied.append(key)
    return True


def copy_keys(src: ArtifactStore, dst: ArtifactStore, keys: Iterable[str],
              progress: TransferProgress | None = None) -> SyncReport:
    """:func:`copy_key` for each of ``keys`` (deduplicated, in order). Once a store could not be reached
    (``report.unreachable``), the keys left are listed as failed with that reason without a try: a dark
    network costs one bounded wait (:mod:`neuron_build.store.wire`), not one per key.

    With ``progress``, what is to copy is counted first (the blobs of the keys ``dst`` lacks, by their
    manifests in ``src``, that ``dst`` does not hold with their size, each blob once: the files and bytes
    :meth:`TransferProgress.begin` is given), then every file is reported as it goes."""
    report = SyncReport()
    todo = list(dict.fromkeys(keys))
    if progress is not None:
        blobs: dict[str, int] = {}
        for key in todo:
            raw = None if dst.lookup(key).hit else src.raw_manifest(key)
            for _, sha, size in _named_entries(raw or {}):
                if sha not in blobs and dst.blob_size(sha) != size:
                    blobs[sha] = max(size, 0)
        progress.begin(len(blobs), sum(blobs.values()))
    try:
        with tempfile.TemporaryDirectory(prefix="neuron-build-sync.") as scratch:
            for key in todo:
                if report.unreachable is not None:  # a dark network costs one bounded wait, not one per key
                    report.failed.append((key, report.unreachable))
                    continue
                copy_key(src, dst, key, Path(scratch), report, progress=progress)
    finally:
        if progress is not None:
            progress.end()
    return report


def copy_records(src: ArtifactStore, dst: ArtifactStore, keys: Iterable[str], report: SyncReport,
                 releases: bool = True) -> None:
    """Copy what describes the copied artifacts: the target records pointing at ``keys``, their
    validation and benchmark results, the graph index entries and NxDI cache pointers pointing at them, and (``releases``) every release record ``dst`` lacks (release
    records are written once: an existing one is never replaced)."""
    wanted = set(keys)
    for rec in src.all_targets():
        if rec.key in wanted and target_id_problem(rec.target) is None:  # an untrusted name is not copied
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
    report.records += graph_index.copy_entries(src, dst, wanted)
    from neuron_build.store import neuron_cache
    report.records += neuron_cache.copy_pointers(src, dst, wanted)
    if releases:
        for model, rid, record in src.releases():
            if name_problem(model) or name_problem(rid) or not isinstance(record, dict) or release_problem(record):
                continue  # a record with names that would become paths outside the store: never copied
            if record is not None and dst.release(model, rid) is None and dst.put_release(model, rid, record):
                report.records += 1


def _pointer(raw: Any) -> tuple[str, int] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("release"), str):
        return None
    v = raw.get("version")
    return raw["release"], v if isinstance(v, int) and not isinstance(v, bool) else 0


def _said(p: tuple[str, int] | None) -> str:
    return "no release" if p is None else f"{p[0]} (version {p[1]})"


def channel_disagreement(ahead: ArtifactStore, behind: ArtifactStore, model: str, channel: str) -> str | None:
    """Why the channel in ``behind`` cannot follow the one in ``ahead`` (one line naming both stores), or
    None when it can: ``behind`` has no pointer, holds the same release at the same version, or an older
    version that ``ahead``'s history does not contradict (it is only behind: another host moved it on).
    A pointer ``ahead`` lacks, one at the same or a later version holding another release, or one whose
    version ``ahead``'s history shows holding another release, disagrees."""
    a = _pointer(ahead.channel_ref(model, channel)[0])
    b = _pointer(behind.channel_ref(model, channel)[0])
    if b is None or a == b:
        return None
    if a is not None and b[1] < a[1] and not any(
            e.get("version") == b[1] and e.get("to") != b[0] and e.get("action") in ("promote", "rollback")
            for e in ahead.history(model, channel)):
        return None
    if a is None:
        return (f"channel {model}/{channel}: {behind.location} holds {_said(b)} but {ahead.location} holds none; "
                f"run `neuron-build push --all` first, so the remote has the channel with its history")
    return (f"channel {model}/{channel}: {ahead.location} holds {_said(a)} but {behind.location} holds {_said(b)}, "
            f"and the histories disagree; nothing was changed. Promote the release you want on one side, or move "
            f"{layout.channel_path(model, channel)} aside on the other")


def copy_channel(src: ArtifactStore, dst: ArtifactStore, model: str, channel: str, report: SyncReport) -> bool:
    """Copy a channel from ``src`` to ``dst`` so that its pointer and its history agree there: every
    history entry ``dst`` lacks first (same names, create-only), then the pointer (compare-and-swap). A
    ``dst`` pointer that disagrees (:func:`channel_disagreement`) is left as it is and the one line is added
    to ``report.disagree``. Returns True when ``dst`` now follows ``src``."""
    why = channel_disagreement(src, dst, model, channel)
    if why is not None:
        report.disagree.append(why)
        return False
    pointer, _ = src.channel_ref(model, channel)
    if pointer is None:
        return True
    hdir = layout.history_dir(model, channel)
    have = set(dst.list_objects(hdir))
    for rel in src.list_objects(hdir):
        if rel not in have:
            data = src.get_object(rel)
            if data is not None and dst.put_object(rel, data, create_only=True):
                report.records += 1
    mine, token = dst.channel_ref(model, channel)
    if mine != pointer and dst.swap_channel(model, channel, pointer, token):
        report.records += 1
    return True


def copy_channels(src: ArtifactStore, dst: ArtifactStore, report: SyncReport) -> None:
    """:func:`copy_channel` of every channel ``src`` holds."""
    for model, channel, _ in list(src.channels()):
        copy_channel(src, dst, model, channel, report)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


__all__ = ["SyncReport", "TransferProgress", "UploadFailed", "channel_disagreement", "copy_blob", "copy_channel", "copy_channels",
           "copy_key", "copy_keys", "copy_records"]
