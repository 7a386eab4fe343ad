"""One garbage collector for every store: the roots computed once, a plan of removals, one apply step.

**Roots** (:func:`gc_roots`): the keys of the current targets (the keys the caller names, and the keys the
records of the current target ids name), the keys every release names (so every channel's release), and
the blobs every release pins. A key is kept when it is a root or younger than the keep window; a blob is
kept when a release pins it or a kept manifest lists it.

**The plan** (:func:`plan_gc`) lists every removal with its reason and size; a dry run is the plan. The
shared areas (``ac/``, ``cas/``, ``logs/``, ``results/``) are planned through the contract, the same for
a folder and a URL; a folder store adds its local leftovers (views, staging folders, old quarantine,
stale lock files, temporary files: :mod:`neuron_build.store.gc_local`).

**Applying** (:func:`apply_gc`) is safe beside live builders, as Bazel's remote caches protect the blobs
``FindMissingBlobs`` reported present: a publisher that finds a blob present *touches* it (its age is
refreshed), and after committing its manifest checks its blobs again and puts back any that are gone. The
collector moves each planned blob into ``trash/`` first, then reads the action cache again and the
blob's age: a blob that a manifest written since the plan lists, or that was touched since, is put back;
only then are the others deleted. Nothing younger than the window is collected. Manifests go before their
blobs, so no reader is left with an entry whose blob gc took.
"""

from __future__ import annotations

import datetime as _dt
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from neuron_build.errors import StoreError, UserError
from neuron_build.store import layout
from neuron_build.store.gc_local import apply_local, drop_key_leftovers, plan_local, tree_bytes
from neuron_build.store.gc_report import DAY_S, TMP_MAX_AGE_S, GcPlan, GcReport, Removal, Unremoved


def release_artifacts(rel: Any) -> list[dict[str, Any]] | None:
    """The ``artifacts`` of a release record (each with ``target``, ``key``, ``files``), or None when it
    is not one."""
    if not isinstance(rel, dict) or not isinstance(rel.get("artifacts"), list):
        return None
    out = []
    for a in rel["artifacts"]:
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            return None
        files = a.get("files") if isinstance(a.get("files"), dict) else {}
        out.append({"target": str(a.get("target")), "key": a["key"], "files": files})
    return out


@dataclass
class Roots:
    """What gc never removes: ``keys`` (current targets' and releases' keys) and ``blobs`` (sha256 of
    every file a release pins)."""

    keys: set[str] = field(default_factory=set)
    blobs: set[str] = field(default_factory=set)


def gc_roots(store: Any, keep_keys: Iterable[str] = (), current_targets: Iterable[str] | None = None) -> Roots:
    """The roots of ``store``, for a folder and a URL alike.

    Args:
        keep_keys: keys to keep (the current matrix's keys).
        current_targets: the target ids of the current matrix: only their records keep keys alive (None:
            every target record does).

    Raises:
        UserError: a release record is unreadable (its artifacts cannot be protected); the message names it.
    """
    roots = Roots(keys=set(keep_keys))
    cur = None if current_targets is None else set(current_targets)
    roots.keys.update(rec.key for rec in store.all_targets() if cur is None or rec.target in cur)
    for model, rid, rel in store.releases():
        arts = release_artifacts(rel)
        if arts is None:
            where = layout.release_path(model, rid)
            where = str(store.folder / where) if store.folder is not None else f"{store.location}/{where}"
            raise UserError(f"{where}: release file is unreadable or has no artifacts list; gc cannot tell "
                            f"which artifacts it keeps. Fix or remove it, then run gc again")
        for a in arts:
            roots.keys.add(a["key"])
            roots.blobs.update(e["sha256"] for e in a["files"].values()
                               if isinstance(e, dict) and isinstance(e.get("sha256"), str))
    return roots


def _created(raw: Any, age: float | None, now: float) -> float | None:
    """Seconds since a manifest was created (its ``created`` field, else the object's age)."""
    if isinstance(raw, dict) and isinstance(raw.get("created"), str):
        try:
            t = _dt.datetime.fromisoformat(raw["created"])
            if t.tzinfo is None:
                t = t.replace(tzinfo=_dt.timezone.utc)
            return now - t.timestamp()
        except ValueError:
            pass
    return age


def _shas(raw: Any) -> set[str]:
    files = raw.get("files") if isinstance(raw, dict) and isinstance(raw.get("files"), dict) else {}
    return {e["sha256"] for e in files.values() if isinstance(e, dict) and isinstance(e.get("sha256"), str)}


def plan_gc(store: Any, roots: Roots, keep_days: float = 7.0, now: float | None = None,
            dry_run: bool = True) -> GcPlan:
    """Plan what ``gc`` removes from ``store`` (reads only)."""
    now = time.time() if now is None else now
    window = keep_days * DAY_S
    plan = GcPlan(GcReport(dry_run=dry_run, keep_days=keep_days), window=window)
    rep = plan.report
    kept: set[str] = set()
    dropped: set[str] = set()
    users: dict[str, set[str]] = {}
    for rel in store.list_objects(layout.ac_dir()):
        parts = rel.split("/")
        key = parts[-1][:-5] if parts[-1].endswith(".json") else ""
        if not (len(parts) == 3 and layout.is_digest(key) and key[:2] == parts[1]):
            rep.unknown.append(Unremoved("unknown", rel, "not an action-cache entry (ac/<key[:2]>/<key>.json); "
                                                        "left as it is"))
            continue
        plan.seen.add(key)
        raw = store.raw_manifest(key)
        for sha in _shas(raw):
            users.setdefault(sha, set()).add(key)
        if key in roots.keys:
            rep.referenced += 1
            kept.add(key)
            continue
        age = _created(raw, store.object_age(rel), now)
        if age is None or age < window:
            rep.kept_young += 1
            kept.add(key)
            continue
        extra = store.list_objects(layout.logs_dir(key)) + store.list_objects(layout.results_dir(key))
        size = sum(store.medium.size(r) or 0 for r in [rel, *extra])
        if store.folder is not None:
            size += tree_bytes(store.view_dir(key))
        target = raw.get("target") if isinstance(raw, dict) else None
        item = Removal("object", rel, size, f"no release, channel or current target references it; "
                                            f"{age / DAY_S:.1f} days old", key=key,
                       target=target if isinstance(target, str) else None)
        plan.manifests.append((key, item))
        plan.extras[key] = extra
        rep.removed.append(item)
        dropped.add(key)
    live = {sha for sha, who in users.items() if who & kept} | roots.blobs
    for rel in store.list_objects(layout.CAS_DIR):
        parts = rel.split("/")
        sha = parts[-1]
        if not (len(parts) == 3 and layout.is_digest(sha) and sha[:2] == parts[1]):
            rep.unknown.append(Unremoved("unknown", rel, "not a blob (cas/<sha[:2]>/<sha>); left as it is"))
            continue
        if sha in live:
            continue
        need = window if sha in users else max(window, TMP_MAX_AGE_S)
        age = store.object_age(rel)
        if age is None or age < need:
            continue
        why = ("listed only by artifacts gc removed" if sha in users
               else f"listed by no manifest or release; {age / DAY_S:.1f} days old")
        item = Removal("blob", rel, store.blob_size(sha) or 0, why)
        plan.blobs.append((sha, need, item))
        rep.removed.append(item)
    keys_logged = sorted({r.split("/")[1] for r in store.list_objects(layout.logs_dir()) if r.count("/") >= 2})
    for key in keys_logged:
        if key in kept or key in dropped or not layout.is_digest(key):
            continue
        objs = store.list_objects(layout.logs_dir(key))
        item = Removal("logs", layout.logs_dir(key), sum(store.medium.size(r) or 0 for r in objs),
                       "its key has no artifact", key=key)
        plan.extras[layout.logs_dir(key)] = objs
        rep.removed.append(item)
    if store.folder is not None:
        plan_local(store, plan, kept | dropped, keep_days, now)
    return plan


def _err(e: BaseException) -> str:
    if isinstance(e, OSError) and not isinstance(e, StoreError):
        return e.strerror or str(e)
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def apply_gc(store: Any, plan: GcPlan) -> GcReport:
    """Carry out a plan (see the module docstring for why a concurrent publish keeps its blobs).

    Returns:
        The report: what was removed, what could not be (with the reason), what was left.
    """
    rep = GcReport(dry_run=False, keep_days=plan.report.keep_days, referenced=plan.report.referenced,
                   kept_young=plan.report.kept_young, unknown=list(plan.report.unknown))
    medium = store.medium
    gone: set[str] = set()
    for key, item in plan.manifests:
        try:
            if not medium.delete(item.path):
                continue  # gone meanwhile (another gc)
        except (OSError, StoreError) as e:
            rep.failed.append(Unremoved(item.kind, item.path, f"{_err(e)} (left in place)"))
            continue
        gone.add(key)
        rep.removed.append(item)
        for rel in plan.extras.get(key, []):
            try:
                medium.delete(rel)
            except (OSError, StoreError) as e:
                rep.failed.append(Unremoved(item.kind, rel, _err(e)))
        if store.folder is not None:
            drop_key_leftovers(store, key, rep)
    # blobs: into trash/ first, then a second look, then put back or delete
    kept_keys = {k for k, _ in plan.manifests} - gone  # could not remove them: their blobs stay
    kept_blobs = set().union(*(_shas(store.raw_manifest(k)) for k in kept_keys)) if kept_keys else set()
    moved: list[tuple[str, str, float, Removal]] = []
    for sha, need, item in plan.blobs:
        if sha in kept_blobs:
            continue
        trash = layout.trash_path(sha, secrets.token_hex(4))
        try:
            if medium.move(item.path, trash):
                moved.append((sha, trash, need, item))
        except (OSError, StoreError) as e:
            rep.failed.append(Unremoved(item.kind, item.path, f"{_err(e)} (left in place)"))
    if moved:
        reused = set()
        for key in set(store.keys()) - plan.seen:  # manifests written since the plan
            reused |= _shas(store.raw_manifest(key))
        for sha, trash, need, item in moved:
            age = medium.age(trash)
            if sha in reused or age is None or age < need:
                _put_back(store, trash, item.path)
                rep.reused += 1
                continue
            try:
                medium.delete(trash)
            except (OSError, StoreError) as e:
                rep.failed.append(Unremoved(item.kind, item.path, f"{_err(e)} (moved to {trash})"))
                continue
            rep.removed.append(item)
    for key in [k for k in plan.extras if k.startswith(layout.logs_dir() + "/")]:
        item = next(r for r in plan.report.removed if r.kind == "logs" and r.path == key)
        if store.raw_manifest(item.key) is not None:
            continue  # its key was published since the plan
        for rel in plan.extras[key]:
            try:
                medium.delete(rel)
            except (OSError, StoreError) as e:
                rep.failed.append(Unremoved(item.kind, rel, _err(e)))
        rep.removed.append(item)
    if store.folder is not None:
        apply_local(store, plan, rep)
    return rep


def _put_back(store: Any, trash: str, rel: str) -> None:
    """Move a blob out of trash/ to where it was, unless a publisher has put it back already."""
    if store.medium.size(rel) is None:
        store.medium.move(trash, rel)
    if store.medium.size(trash) is not None:
        store.medium.delete(trash)


def collect_garbage(store: Any, keep_keys: Iterable[str] = (), keep_days: float = 7.0, dry_run: bool = False,
                    now: float | None = None, current_targets: Iterable[str] | None = None) -> GcReport:
    """Remove what nothing needs from ``store`` (a folder or a URL), and say exactly what was removed and
    what could not be: :func:`gc_roots`, :func:`plan_gc`, then (unless ``dry_run``) :func:`apply_gc`.

    Args:
        keep_keys: keys to keep (the current matrix's keys).
        keep_days: the keep window: nothing younger is collected.
        current_targets: the target ids of the current matrix (None: every target record keeps its key).

    Raises:
        UserError: ``keep_days`` is negative, a release record is unreadable, or the store is read-only
            (without ``dry_run``).
    """
    if keep_days < 0:
        raise UserError(f"--keep-days {keep_days:g} is negative; give 0 or more days")
    if store.read_only and not dry_run:
        raise UserError(f"store at {store.location} is read-only; gc removes nothing there "
                        f"(run it where the store can be written, or with --dry-run)")
    plan = plan_gc(store, gc_roots(store, keep_keys, current_targets), keep_days, now, dry_run)
    if dry_run:
        return plan.report
    return apply_gc(store, plan)


__all__ = ["Roots", "apply_gc", "collect_garbage", "gc_roots", "plan_gc", "release_artifacts"]
