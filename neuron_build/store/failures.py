"""Kept workdirs of failed compiles: the one place to diagnose a failure, kept beside its record, bounded.

A failed attempt's work folder (``request.json``, ``worker.log``, ``error.json`` and the compiler's workdir:
on Neuron ``neuron/model/graph.hlo``, ``neuron/command.txt``, ``neuron/log-neuron-cc.txt``) is copied into
the store through :class:`~neuron_build.store.contract.ObjectIO`::

    failures/<target id>/<yyyymmddTHHMMSS.ffffff>Z-<token>/files/<path in the work folder>
    failures/<target id>/<yyyymmddTHHMMSS.ffffff>Z-<token>/entry.json   written last: the commit point

``entry.json`` holds the failure (key, status, reason, stage, compiler pass, diagnostic code, time) and
every kept file with its size. An entry without ``entry.json`` is incomplete (its writer died) and is
never listed. The bounds: the newest ``keep_last`` entries per target, and at most ``max_bytes`` over
all entries (the oldest go first; a file that alone would pass the cap is left out and named in
``omitted``). ``gc`` removes a target's entries once the target passes again.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.status import Status
from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import FAILURES_DIR, failure_entry_path

ENTRY = "entry.json"
_ENTRY_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{8}$")


@dataclass(frozen=True)
class KeptFailure:
    """One kept failure workdir.

    Attributes:
        target: the target id; entry: the entry's folder name (sorts by time); path: the entry's folder in
            the store (``failures/<target id>/<entry>``).
        key, status, reason, time: the failed attempt (time ISO 8601, UTC).
        failure_stage, compiler_pass, diagnostic_code: where it stopped (see
            :class:`~neuron_build.store.ledger.LedgerRecord`).
        files: kept file (relative to the work folder) -> size in bytes.
        omitted: files left out because they alone would pass the size cap -> size in bytes.
    """

    target: str
    entry: str
    key: str
    status: str
    reason: str = ""
    time: str = ""
    failure_stage: str | None = None
    compiler_pass: str | None = None
    diagnostic_code: str | None = None
    files: dict[str, int] = field(default_factory=dict)
    omitted: dict[str, int] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return f"{FAILURES_DIR}/{self.target}/{self.entry}"

    @property
    def bytes(self) -> int:
        """Total size of the kept files, bytes."""
        return sum(self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "entry": self.entry, "path": self.path, "key": self.key, "status": self.status,
                "reason": self.reason, "time": self.time, "failure_stage": self.failure_stage,
                "compiler_pass": self.compiler_pass, "diagnostic_code": self.diagnostic_code, "bytes": self.bytes,
                "files": dict(self.files), "omitted": dict(self.omitted)}

    @classmethod
    def from_json(cls, raw: Any) -> KeptFailure | None:
        """The entry in ``raw`` (an ``entry.json``), or None when it is not one."""
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str) for k in ("target", "entry", "key", "status")):
            return None
        files = raw.get("files") if isinstance(raw.get("files"), dict) else {}
        omitted = raw.get("omitted") if isinstance(raw.get("omitted"), dict) else {}

        def opt(k: str) -> str | None:
            return str(raw[k]) if raw.get(k) is not None else None

        return cls(target=raw["target"], entry=raw["entry"], key=raw["key"], status=raw["status"],
                   reason=str(raw.get("reason") or ""), time=str(raw.get("time") or ""),
                   failure_stage=opt("failure_stage"), compiler_pass=opt("compiler_pass"),
                   diagnostic_code=opt("diagnostic_code"),
                   files={str(k): int(v) for k, v in files.items() if isinstance(v, int)},
                   omitted={str(k): int(v) for k, v in omitted.items() if isinstance(v, int)})


def entry_name(now: _dt.datetime | None = None) -> str:
    """A fresh entry folder name: ``<yyyymmddTHHMMSS.ffffff>Z-<8 hex>`` (UTC), sorting by time."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return f"{now.astimezone(_dt.timezone.utc).strftime('%Y%m%dT%H%M%S.%f')}Z-{secrets.token_hex(4)}"


def keep_workdir(store: ObjectIO, folder: Path, failure: dict[str, Any], keep_last: int,
                 max_bytes: int) -> tuple[KeptFailure | None, list[KeptFailure]]:
    """Copy the files of a failed attempt's work ``folder`` into the store as a new entry, then apply the
    bounds (:func:`prune`).

    Args:
        folder: the attempt's work folder (local).
        failure: ``target``, ``key``, ``status`` and optionally ``reason``, ``time``, ``failure_stage``,
            ``compiler_pass``, ``diagnostic_code``.
        keep_last: entries kept per target (0: keep none, and write none).
        max_bytes: the cap on all entries together, bytes (0: keep none).

    Returns:
        (the new entry or None when nothing was kept, the entries the bounds removed).

    Raises:
        OSError: the store could not be written; what was written of the entry is removed again (and an
            entry without ``entry.json`` is never listed; ``gc`` removes one left by a killed writer).
    """
    if keep_last <= 0 or max_bytes <= 0:
        return None, []
    target = failure["target"]
    entry = entry_name()
    files: dict[str, int] = {}
    omitted: dict[str, int] = {}
    total = 0
    try:
        for p in sorted(q for q in folder.rglob("*") if q.is_file() and not q.is_symlink()):
            rel = p.relative_to(folder).as_posix()
            size = p.stat().st_size
            if total + size > max_bytes:
                omitted[rel] = size
                continue
            files[rel] = size
            store.put_object(failure_entry_path(target, entry, f"files/{rel}"), p.read_bytes())
            total += size
    except OSError:  # e.g. a full disk: leave nothing half-kept behind
        for rel in files:
            try:
                store.delete_object(failure_entry_path(target, entry, f"files/{rel}"))
            except OSError:
                pass
        raise
    kept = KeptFailure(target=target, entry=entry, key=failure["key"], status=str(failure["status"]),
                       reason=str(failure.get("reason") or ""), time=str(failure.get("time") or ""),
                       failure_stage=failure.get("failure_stage"), compiler_pass=failure.get("compiler_pass"),
                       diagnostic_code=failure.get("diagnostic_code"), files=files, omitted=omitted)
    store.put_object(failure_entry_path(target, entry), (json.dumps(kept.to_json(), indent=2) + "\n").encode())
    return kept, prune(store, keep_last, max_bytes)


def kept(store: ObjectIO, target_id: str | None = None) -> list[KeptFailure]:
    """Every complete kept entry (of one target when given), oldest first."""
    base = f"{FAILURES_DIR}/{target_id}" if target_id else FAILURES_DIR
    out = []
    for path in store.list_objects(base):
        parts = path.split("/")
        if parts[-1] != ENTRY or len(parts) < 3 or not _ENTRY_NAME.match(parts[-2]):
            continue
        data = store.get_object(path)
        try:
            ent = KeptFailure.from_json(json.loads(data)) if data is not None else None
        except ValueError:
            ent = None
        if ent is not None and ent.path == "/".join(parts[:-1]):
            out.append(ent)
    out.sort(key=lambda e: (e.entry, e.target))
    return out


def remove(store: ObjectIO, ent: KeptFailure) -> int:
    """Delete one entry (its ``entry.json`` first, so a half-deleted entry is never listed); bytes freed."""
    store.delete_object(failure_entry_path(ent.target, ent.entry))
    for path in store.list_objects(ent.path):
        store.delete_object(path)
    return ent.bytes


def prune(store: ObjectIO, keep_last: int, max_bytes: int) -> list[KeptFailure]:
    """Apply the bounds: the newest ``keep_last`` entries of each target, then the oldest entries overall
    until all together hold at most ``max_bytes``. Returns the entries removed."""
    entries = kept(store)
    removed: list[KeptFailure] = []
    by_target: dict[str, list[KeptFailure]] = {}
    for e in entries:
        by_target.setdefault(e.target, []).append(e)
    for lst in by_target.values():
        for e in lst[:-keep_last] if keep_last > 0 else lst:
            removed.append(e)
    left = [e for e in entries if e not in removed]
    total = sum(e.bytes for e in left)
    for e in left:
        if total <= max_bytes:
            break
        removed.append(e)
        total -= e.bytes
    for e in removed:
        remove(store, e)
    return removed


def of_targets(entries: Iterable[KeptFailure], targets: set[str]) -> list[KeptFailure]:
    """The entries whose target is in ``targets``."""
    return [e for e in entries if e.target in targets]


def entry_time(ent: KeptFailure) -> _dt.datetime:
    """When the entry was kept (from its name, UTC)."""
    return _dt.datetime.strptime(ent.entry.split("Z-")[0], "%Y%m%dT%H%M%S.%f").replace(tzinfo=_dt.timezone.utc)


def passed_again(store: Any) -> list[tuple[KeptFailure, str]]:
    """The kept entries whose target passed after the failure: the build ledger has a passing record of
    the target (a compile that passed, a cache hit, a reuse) newer than the entry, or the target record
    says PASS. [(entry, when it passed)], for ``gc``. ``store`` is an
    :class:`~neuron_build.store.contract.ObjectIO` that is also a
    :class:`~neuron_build.store.contract.RecordStore`."""
    from neuron_build.store import ledger

    entries = kept(store)
    if not entries:
        return []
    passes: dict[str, _dt.datetime] = {}
    for r in ledger.read(store, since=min(entry_time(e) for e in entries)):
        if r.ok:
            passes[r.target] = r.when
    out = []
    for e in entries:
        if e.target in passes and passes[e.target] > entry_time(e):
            out.append((e, passes[e.target].isoformat(timespec="seconds")))
            continue
        rec = store.target(e.target)
        if rec is not None and rec.status == Status.PASS:
            out.append((e, rec.time))
    return out


def incomplete(store: ObjectIO, older_than_s: float, now: _dt.datetime | None = None) -> list[tuple[str, list[str]]]:
    """Entry folders without ``entry.json`` (their writer died) older than ``older_than_s`` seconds by their
    name: [(entry folder, its object paths)], for ``gc``."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    folders: dict[str, list[str]] = {}
    complete = set()
    for path in store.list_objects(FAILURES_DIR):
        parts = path.split("/")
        for i in range(2, len(parts)):
            if _ENTRY_NAME.match(parts[i - 1]) and parts[i] in ("files", ENTRY):
                folder = "/".join(parts[:i])
                folders.setdefault(folder, []).append(path)
                if parts[i] == ENTRY and i == len(parts) - 1:
                    complete.add(folder)
                break
    out = []
    for folder, paths in sorted(folders.items()):
        if folder in complete:
            continue
        stamp = folder.rsplit("/", 1)[1].split("Z-")[0]
        try:
            t = _dt.datetime.strptime(stamp, "%Y%m%dT%H%M%S.%f").replace(tzinfo=_dt.timezone.utc)
        except ValueError:
            continue
        if (now - t).total_seconds() >= older_than_s:
            out.append((folder, paths))
    return out


__all__ = ["ENTRY", "KeptFailure", "entry_name", "entry_time", "incomplete", "keep_workdir", "kept", "of_targets", "passed_again",
           "prune", "remove"]
