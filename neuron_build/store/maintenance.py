"""Store upkeep: ``verify`` (every object against its manifest, corrupt ones quarantined) and ``gc``
(unreferenced objects and old leftovers removed).

What references an object (``gc`` never removes it): the current key of any target record
(``targets/**/last.json``), any release (``releases/<model>/<release id>.json``, its ``artifacts[].key``;
channels point at releases, so every key a channel can reach is a release's key), and the keys of the
current matrix passed in by the caller.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.store.local import LocalStore, is_key, pid_alive
from neuron_build.util import read_json

DAY_S = 86400.0
#: Temporary files (``.<name>.<pid>.<token>.tmp``) live milliseconds; ones older than this were left by a
#: killed process.
TMP_MAX_AGE_S = 3600.0


def tree_bytes(path: Path) -> int:
    """Total size in bytes of the files under ``path`` (a file's own size for a file); 0 when absent."""
    try:
        if path.is_file() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


# ------------------------------------------------------------------------------------------------------
# verify

@dataclass
class BadObject:
    """An object that failed verification: its key (or folder name), target, reason, and where it went."""

    key: str
    target: str | None
    reason: str
    moved_to: str | None


@dataclass
class VerifyReport:
    """What ``verify`` found. ``problems`` are reference faults: a release naming a key that is not a
    complete object, a channel naming a release that does not exist or does not parse."""

    deep: bool
    checked: int = 0
    ok: int = 0
    bad: list[BadObject] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.bad and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"deep": self.deep, "checked": self.checked, "ok": self.ok, "clean": self.clean,
                "bad": [asdict(b) for b in self.bad], "problems": self.problems}


def verify_store(store: LocalStore, deep: bool = False) -> VerifyReport:
    """Check every object in ``objects/``; move each bad one to ``quarantine/`` with its reason.

    Cheap checks (manifest parses and matches its own sha256, PASS, exactly the listed files with the
    listed sizes) always; ``deep`` also compares every file's sha256. Anything under ``objects/`` that is
    not a key's folder in its prefix folder is quarantined too. Then every release's keys and every
    channel's release are checked to exist.
    """
    rep = VerifyReport(deep=deep)
    base = store.area("objects")
    for sub in sorted(base.iterdir()) if base.is_dir() else []:
        entries = sorted(sub.iterdir()) if sub.is_dir() else [sub]
        for d in entries:
            rep.checked += 1
            name = d.name
            if not (sub.is_dir() and d.is_dir() and is_key(name) and name[:2] == sub.name):
                where = store.relative(d)
                moved = store.quarantine_path(d, f"{where} is not an object folder (objects/<key[:2]>/<key>/)")
                rep.bad.append(BadObject(name, None, f"{where} is not an object folder", store.relative(moved)))
                continue
            reason = store.lookup(name, deep=deep).damage
            if reason is None:
                rep.ok += 1
                continue
            man = read_json(d / "manifest.json")
            target = man.get("target") if isinstance(man, dict) and isinstance(man.get("target"), str) else None
            moved = store.quarantine(name, reason + (" (found by verify --deep)" if deep else " (found by verify)"))
            rep.bad.append(BadObject(name, target, reason, moved))
    for model, rid, rel in store.releases():
        where = f"releases/{model}/{rid}.json"
        keys = _release_keys(rel)
        if keys is None:
            rep.problems.append(f"{where}: not a readable release (JSON with artifacts)")
            continue
        for tid, key in keys:
            if not store.is_complete(key):
                rep.problems.append(f"{where}: artifact {tid} key {key[:12]} is not in the store")
    for model, channel, ch in store.channels():
        where = f"channels/{model}/{channel}.json"
        rid = ch.get("release") if isinstance(ch, dict) else None
        if not isinstance(rid, str):
            rep.problems.append(f"{where}: not a readable channel (JSON with release)")
            continue
        if _release_keys(store.release(model, rid)) is None:
            rep.problems.append(f"{where}: points at release {rid}, "
                                f"but releases/{model}/{rid}.json is missing or unreadable")
    return rep


def _release_keys(rel: Any) -> list[tuple[str, str]] | None:
    """[(target, key)] of a release record, or None when it is not one."""
    if not isinstance(rel, dict) or not isinstance(rel.get("artifacts"), list):
        return None
    out = []
    for a in rel["artifacts"]:
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            return None
        out.append((str(a.get("target")), a["key"]))
    return out


# ------------------------------------------------------------------------------------------------------
# gc

@dataclass
class Removal:
    """One thing ``gc`` removes (or would remove, on a dry run): ``kind`` is ``object``, ``staging``,
    ``quarantine``, ``lock``, ``temp`` or ``failure-workdir``; ``bytes`` its size; ``why`` one line."""

    kind: str
    path: str
    bytes: int
    why: str
    key: str | None = None
    target: str | None = None


@dataclass
class GcReport:
    """What ``gc`` removed (or would remove): ``referenced`` is the number of keys it kept as referenced."""

    dry_run: bool
    keep_days: float
    referenced: int = 0
    kept_young: int = 0
    removed: list[Removal] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "keep_days": self.keep_days, "referenced": self.referenced,
                "kept_young": self.kept_young, "bytes_freed": self.bytes_freed,
                "removed": [asdict(r) for r in self.removed]}


def referenced_keys(store: LocalStore, extra: Iterable[str] = ()) -> set[str]:
    """Keys that ``gc`` must keep: ``extra`` (e.g. the current matrix), every target record's key, every
    release's keys.

    Raises:
        UserError: a release file is unreadable (its keys cannot be protected); the message names it.
    """
    keys = set(extra)
    keys.update(rec.key for rec in store.all_targets())
    for model, rid, rel in store.releases():
        rk = _release_keys(rel)
        if rk is None:
            raise UserError(f"{store.area('releases') / model / (rid + '.json')}: release file is unreadable or has no artifacts list; gc cannot tell which "
                            f"artifacts it keeps. Fix or remove it, then run gc again")
        keys.update(k for _, k in rk)
    return keys


def collect_garbage(store: LocalStore, keep_keys: Iterable[str] = (), keep_days: float = 7.0, dry_run: bool = False,
                    now: float | None = None) -> GcReport:
    """Remove what nothing needs.

    - objects whose key is not referenced (see :func:`referenced_keys`) and that are older than
      ``keep_days`` (age from the manifest's ``created``, else the folder's mtime), with their
      ``results/<key>/`` and lock files;
    - staging folders of builders that are no longer running on this host (any age), or from other hosts
      and older than ``keep_days``;
    - quarantined objects older than ``keep_days``; lock files moved aside when a stale lock was broken;
      temporary files older than an hour (left by killed writers).

    Objects are first renamed into ``<store>/trash/`` (so readers see them whole or not at all), then
    deleted. ``dry_run`` removes nothing and reports the same list.

    Raises:
        UserError: ``keep_days`` is negative, or a release file is unreadable.
    """
    if keep_days < 0:
        raise UserError(f"--keep-days {keep_days:g} is negative; give 0 or more days")
    now = time.time() if now is None else now
    horizon = keep_days * DAY_S
    rep = GcReport(dry_run=dry_run, keep_days=keep_days)
    refs = referenced_keys(store, keep_keys)
    trash = store.area("trash")

    def drop(path: Path, item: Removal, atomic: bool = False) -> None:
        rep.removed.append(item)
        if dry_run:
            return
        if atomic:
            trash.mkdir(parents=True, exist_ok=True)
            dest = trash / f"{path.name}.{secrets.token_hex(4)}"
            try:
                os.rename(path, dest)
            except FileNotFoundError:
                return
            path = dest
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # objects
    for key in store.keys():
        d = store.object_dir(key)
        if key in refs:
            rep.referenced += 1
            continue
        if not d.is_dir():
            continue  # a stray entry: verify quarantines those
        man = read_json(d / "manifest.json")
        age = now - _created(man, d)
        if age < horizon:
            rep.kept_young += 1
            continue
        target = man.get("target") if isinstance(man, dict) else None
        results = store.area("results") / key
        size = tree_bytes(d) + tree_bytes(results)
        drop(d, Removal("object", store.relative(d), size,
                        f"referenced by no target record, release or channel; {age / DAY_S:.1f} days old",
                        key=key, target=target), atomic=True)
        if not dry_run:
            shutil.rmtree(results, ignore_errors=True)
            _drop_lock_files(store, key)

    # staging leftovers
    host = socket.gethostname()
    sbase = store.area("staging")
    for d in sorted(sbase.iterdir()) if sbase.is_dir() else []:
        owner = store.staging_owner(d)
        age = now - _mtime(d)
        why = None
        if owner is not None and owner[0] == host:
            pid = owner[1]
            if pid != os.getpid() and not pid_alive(pid):
                why = f"left by pid {pid}, which is no longer running"
        elif age >= horizon:
            why = f"left by another host or an unknown writer; {age / DAY_S:.1f} days old"
        if why:
            drop(d, Removal("staging", store.relative(d), tree_bytes(d), why))

    # quarantine
    qbase = store.area("quarantine")
    for d in sorted(qbase.iterdir()) if qbase.is_dir() else []:
        age = now - _mtime(d)
        if age >= horizon:
            reason = ""
            try:
                reason = (d / "reason.txt").read_text().strip()
            except OSError:
                pass
            drop(d, Removal("quarantine", store.relative(d), tree_bytes(d),
                            f"quarantined {age / DAY_S:.1f} days ago" + (f": {reason}" if reason else ""),
                            key=d.name.split(".")[0]))

    # lock files moved aside, temporary files of killed writers, an interrupted gc's trash
    lbase = store.area("locks")
    for p in sorted(lbase.glob("*.lock.stale-*")) if lbase.is_dir() else []:
        drop(p, Removal("lock", store.relative(p), tree_bytes(p), "stale lock file moved aside"))
    for area in ("targets", "results", "locks", "releases", "channels"):
        abase = store.area(area)
        for p in sorted(abase.rglob(".*.tmp")) if abase.is_dir() else []:
            if now - _mtime(p) >= TMP_MAX_AGE_S:
                drop(p, Removal("temp", store.relative(p), tree_bytes(p),
                                "temporary file left by a killed writer"))
    rep.removed += collect_failure_workdirs(store, dry_run=dry_run)
    if not dry_run and trash.is_dir():
        for p in trash.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return rep


def collect_failure_workdirs(store: Any, dry_run: bool = False) -> list[Removal]:
    """The ``gc`` step of the kept failure workdirs (:mod:`neuron_build.store.failures`): every entry of a
    target that passes again, and entries whose writer died before their ``entry.json`` (older than an
    hour). Removes them unless ``dry_run``; returns what it removed (kind ``failure-workdir``)."""
    from neuron_build.store import failures

    out = []
    for ent, when in failures.passed_again(store):
        out.append(Removal("failure-workdir", ent.path, ent.bytes, f"the target passed again ({when})",
                           key=ent.key, target=ent.target))
        if not dry_run:
            failures.remove(store, ent)
    for folder, paths in failures.incomplete(store, TMP_MAX_AGE_S):
        out.append(Removal("failure-workdir", folder, 0, "incomplete (its writer stopped before entry.json)"))
        if not dry_run:
            for p in paths:
                store.delete_object(p)
    return out


def _drop_lock_files(store: LocalStore, key: str) -> None:
    """Remove a removed key's lock file, only while holding it (a builder that opened it meanwhile sees
    the file gone and locks a new one)."""
    from filelock import FileLock, Timeout

    path = store.area("locks") / f"{key}.lock"
    if not path.exists():
        return
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return
    try:
        path.unlink(missing_ok=True)
        (store.area("locks") / f"{key}.owner.json").unlink(missing_ok=True)
    finally:
        lock.release()


def _created(man: Any, d: Path) -> float:
    if isinstance(man, dict) and isinstance(man.get("created"), str):
        try:
            t = _dt.datetime.fromisoformat(man["created"])
            if t.tzinfo is None:
                t = t.replace(tzinfo=_dt.timezone.utc)
            return t.timestamp()
        except ValueError:
            pass
    return _mtime(d)


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return time.time()


__all__ = ["verify_store", "VerifyReport", "BadObject", "collect_failure_workdirs", "collect_garbage", "GcReport",
           "Removal", "referenced_keys", "tree_bytes"]
