"""The part of :mod:`neuron_build.store.gc` only a folder store has: its local areas (views, staging
folders, quarantine, lock files moved aside, temporary files of killed writers, an interrupted gc's trash),
the store folder's entries that are no area (left, and listed as unknown), and the kept failure workdirs.
Removals are renames into ``trash/`` first (readers see an object whole or not at all), then deletes."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from neuron_build.store import layout
from neuron_build.store.digests import pid_alive
from neuron_build.store.gc_report import DAY_S, TMP_MAX_AGE_S, GcPlan, GcReport, Removal, Unremoved


def tree_bytes(path: Path) -> int:
    """Total size in bytes of the files under ``path`` (a file's own size for a file); 0 when absent."""
    try:
        if path.is_file() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return time.time()


def plan_local(store: Any, plan: GcPlan, keys: set[str], keep_days: float, now: float) -> None:
    """Add the local leftovers of a folder store to ``plan`` (``keys``: every key with a manifest)."""
    rep = plan.report
    horizon = keep_days * DAY_S

    def add(p: Path, item: Removal) -> None:
        plan.local.append((p, item))
        rep.removed.append(item)

    def unknown(p: Path, why: str) -> None:
        rep.unknown.append(Unremoved("unknown", store.relative(p) or str(p), why))

    known = set(layout.SHARED_AREAS) | set(layout.LOCAL_AREAS)
    for p in sorted(store.root.iterdir()) if store.root.is_dir() else []:
        if p.name not in known:
            unknown(p, "not an area of the store layout; left as it is")
    base = store.area(layout.VIEWS_DIR)
    for d in [d for sub in sorted(base.iterdir()) if sub.is_dir() for d in sorted(sub.iterdir())] if base.is_dir() else []:
        if d.name.startswith("."):  # a view being built, or an interrupted build
            if now - _mtime(d) >= TMP_MAX_AGE_S:
                add(d, Removal("view", store.relative(d), tree_bytes(d), "left by an interrupted view build"))
            continue
        if not (d.is_dir() and layout.is_digest(d.name) and d.name[:2] == d.parent.name):
            unknown(d, "not a view folder of a key; left as it is")
        elif d.name not in keys:
            add(d, Removal("view", store.relative(d), tree_bytes(d), "its key has no artifact", key=d.name))
    host = socket.gethostname()
    for d in sorted(store.area(layout.STAGING_DIR).iterdir()) if store.area(layout.STAGING_DIR).is_dir() else []:
        owner = store.staging_owner(d)
        age = now - _mtime(d)
        why = None
        if owner is not None and owner[0] == host:
            if owner[1] != os.getpid() and not pid_alive(owner[1]):
                why = f"left by pid {owner[1]}, which is no longer running"
        elif age >= horizon:
            why = f"left by another host or an unknown writer; {age / DAY_S:.1f} days old"
        if why:
            add(d, Removal("staging", store.relative(d), tree_bytes(d), why))
    for d in sorted(store.area(layout.QUARANTINE_DIR).iterdir()) if store.area(layout.QUARANTINE_DIR).is_dir() else []:
        age = now - _mtime(d)
        if age >= horizon:
            try:
                reason = (d / "reason.txt").read_text().strip()
            except OSError:
                reason = ""
            add(d, Removal("quarantine", store.relative(d), tree_bytes(d),
                           f"quarantined {age / DAY_S:.1f} days ago" + (f": {reason}" if reason else ""),
                           key=d.name.split(".")[0]))
    lbase = store.area(layout.LOCKS_DIR)
    for p in sorted(lbase.glob("*.lock.stale-*")) if lbase.is_dir() else []:
        add(p, Removal("lock", store.relative(p), tree_bytes(p), "stale lock file moved aside"))
    for area in (layout.AC_DIR, layout.CAS_DIR, layout.LOGS_DIR, layout.TARGETS_DIR, layout.RESULTS_DIR, layout.LOCKS_DIR,
                 layout.RELEASES_DIR, layout.CHANNELS_DIR):
        abase = store.area(area)
        for p in sorted(abase.rglob(".*.tmp")) if abase.is_dir() else []:
            if now - _mtime(p) >= TMP_MAX_AGE_S:
                add(p, Removal("temp", store.relative(p), tree_bytes(p), "temporary file left by a killed writer"))
    if plan.report.dry_run:
        rep.removed += collect_failure_workdirs(store, dry_run=True)


def apply_local(store: Any, plan: GcPlan, rep: GcReport) -> None:
    """Remove the planned local leftovers, the kept failure workdirs of targets that pass again, and an
    interrupted gc's trash."""
    trash = store.area(layout.TRASH_DIR)
    for path, item in plan.local:
        try:
            trash.mkdir(parents=True, exist_ok=True)
            dest = trash / f"{path.name}.{secrets.token_hex(4)}"
            os.rename(path, dest)
        except FileNotFoundError:
            continue  # gone meanwhile (another gc): nothing removed by us
        except OSError as e:
            rep.failed.append(Unremoved(item.kind, item.path, f"{e.strerror or e} (left in place)"))
            continue
        err = delete_tree(dest)
        if err:
            rep.failed.append(Unremoved(item.kind, item.path, f"{err} (moved to {store.relative(dest)})"))
            continue
        rep.removed.append(item)
    rep.removed += collect_failure_workdirs(store, dry_run=False)
    for p in trash.iterdir() if trash.is_dir() else []:
        if p.name[:64] and layout.is_digest(p.name[:64]) and time.time() - _mtime(p) < TMP_MAX_AGE_S:
            continue  # a blob another gc running now is looking at again
        err = delete_tree(p)
        if err:
            rep.failed.append(Unremoved("trash", store.relative(p), err))


def drop_key_leftovers(store: Any, key: str, rep: GcReport) -> None:
    """After ``key``'s manifest went: its view and its lock files (only while holding the lock: a builder
    that opened it meanwhile sees the file gone and locks a new one)."""
    view = store.view_dir(key)
    if view.exists():
        err = delete_tree(view)
        if err:
            rep.failed.append(Unremoved("object", store.relative(view), err))
    from filelock import FileLock, Timeout

    path = store.path(layout.lock_path(key))
    if not path.exists():
        return
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return
    try:
        path.unlink(missing_ok=True)
        store.path(layout.lock_path(key, ".owner.json")).unlink(missing_ok=True)
    finally:
        lock.release()


def delete_tree(path: Path) -> str | None:
    """Delete a file or a folder tree; the first error as text, or None when it is gone."""
    errors: list[str] = []

    def onexc(_fn, p, e) -> None:
        errors.append(f"{p}: {getattr(e, 'strerror', None) or e}")

    try:
        if path.is_dir() and not path.is_symlink():
            if sys.version_info >= (3, 12):
                shutil.rmtree(path, onexc=onexc)
            else:
                shutil.rmtree(path, onerror=lambda fn, p, info: onexc(fn, p, info[1]))
        else:
            path.unlink()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    return errors[0] if errors else None


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


__all__ = ["apply_local", "collect_failure_workdirs", "delete_tree", "drop_key_leftovers", "plan_local", "tree_bytes"]
