"""Store upkeep: ``verify`` (every manifest and blob against its digests; damage reported with what it
breaks, moved to quarantine only with ``repair``) and ``gc`` (what nothing needs, removed; what could not
be removed, said).

**GC roots**: a blob is kept when a release pins it (``releases/<model>/<id>.json``, ``artifacts[].files``
by sha256: channels point at releases, so a channel's release is a release), or when the manifest of a
kept key lists it. A key is kept when a release names it, when it is the key of a *current* target (a
target id of the project's current matrix, its current key or the key its record names), or when it is
younger than the keep window. Targets that left the matrix keep nothing alive.
"""

from __future__ import annotations

import datetime as _dt
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.store import layout
from neuron_build.store.local import LocalStore, pid_alive

DAY_S = 86400.0
#: Temporary files (``.<name>.<pid>.<token>.tmp``) live milliseconds; ones older than this were left by a
#: killed process. Blobs that no manifest lists yet are kept this long too (a build may be publishing them).
TMP_MAX_AGE_S = 3600.0


def tree_bytes(path: Path) -> int:
    """Total size in bytes of the files under ``path`` (a file's own size for a file); 0 when absent."""
    try:
        if path.is_file() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0


def _release_artifacts(rel: Any) -> list[dict[str, Any]] | None:
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


def _release_keys(rel: Any) -> list[tuple[str, str]] | None:
    """[(target, key)] of a release record, or None when it is not one."""
    arts = _release_artifacts(rel)
    return None if arts is None else [(a["target"], a["key"]) for a in arts]


@dataclass
class Pins:
    """Who pins what: ``blobs`` sha256 -> ["release m/r-...", "channel m/prod", ...] and the files' names."""

    blobs: dict[str, list[str]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)


def release_pins(store: LocalStore) -> Pins:
    """The blobs every release pins, each with the releases and channels that pin it."""
    by_release: dict[tuple[str, str], list[str]] = {}
    for model, channel, ptr in store.channels():
        rid = ptr.get("release") if isinstance(ptr, dict) else None
        if isinstance(rid, str):
            by_release.setdefault((model, rid), []).append(f"channel {model}/{channel}")
    pins = Pins()
    for model, rid, rel in store.releases():
        for a in _release_artifacts(rel) or []:
            for name, ent in a["files"].items():
                sha = ent.get("sha256") if isinstance(ent, dict) else None
                if not isinstance(sha, str):
                    continue
                who = pins.blobs.setdefault(sha, [])
                for w in [f"release {model}/{rid}", *by_release.get((model, rid), [])]:
                    if w not in who:
                        who.append(w)
                pins.names.setdefault(sha, name)
                pins.targets.setdefault(sha, a["target"])
                if isinstance(ent.get("size"), int):
                    pins.sizes.setdefault(sha, ent["size"])
    return pins


# ------------------------------------------------------------------------------------------------------
# verify

@dataclass
class BadObject:
    """Something that failed verification.

    ``kind``: ``manifest`` (an action-cache entry: unreadable, edited, another key, not PASS) or ``blob``
    (a file's content: missing, another size, another digest). ``key``: the key (manifest) or sha256
    (blob). ``keys``: the keys whose manifests list a damaged blob. ``pinned_by``: the releases and
    channels that pin it (``release m/r-...``, ``channel m/prod``). ``fix``: what to run.
    ``moved_to``: where ``--repair`` moved it (None when reported only).
    """

    key: str
    target: str | None
    reason: str
    moved_to: str | None = None
    kind: str = "manifest"
    keys: list[str] = field(default_factory=list)
    pinned_by: list[str] = field(default_factory=list)
    fix: str = ""


@dataclass
class VerifyReport:
    """What ``verify`` found. ``problems`` are reference faults: a release naming a key with no complete
    artifact, a channel naming a release that does not exist or does not parse."""

    deep: bool
    repair: bool = False
    checked: int = 0
    ok: int = 0
    blobs_checked: int = 0
    bad: list[BadObject] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.bad and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"deep": self.deep, "repair": self.repair, "checked": self.checked, "ok": self.ok,
                "blobs_checked": self.blobs_checked, "clean": self.clean,
                "bad": [asdict(b) for b in self.bad], "problems": self.problems}


def blob_fix(target: str | None, damage: str, pinned_by: list[str] | tuple[str, ...] = ()) -> str:
    """The one-line fix for a blob that is missing or damaged (``damage``: its reason from
    :meth:`~neuron_build.store.local.LocalStore.blob_damage`) of ``target``'s artifact, pinned by the
    releases and channels ``pinned_by``.

    A blob whose bytes changed but not its size passes the cheap check a build makes, so the build would
    call it cached: ``verify --deep --repair`` must move it to quarantine/ first. A rebuild heals a release
    that pins the blob only when the compile gives the same bytes (torchscript does; AOTInductor does
    not): otherwise the rebuilt artifact is a new one, and only a new release promoted heals the channel.
    """
    build = f"`neuron-build build {target}`" if target else "`neuron-build build`"
    hidden = "hashes to" in damage or "unreadable" in damage  # only a deep check sees it
    step = (f"`neuron-build verify --deep --repair` (moves the damaged blob to quarantine/), then {build}"
            if hidden else build)
    if not pinned_by:
        return f"{step} compiles it again"
    model = target.split("/")[0] if target else "MODEL"
    return (f"{step} compiles it again; unless that compile is byte-identical (AOTInductor's is not) it is a "
            f"new artifact the release does not pin: make and promote a new release (`neuron-build release "
            f"{model} && neuron-build promote {model} RELEASE --to CHANNEL`)")


def orphan_blob_fix(target: str | None) -> str:
    """The one-line fix for a missing or damaged blob that releases pin but no stored artifact lists (the
    target was built again since, to other bytes): no build writes it again, only a new release heals."""
    build = f"`neuron-build build {target}`" if target else "`neuron-build build`"
    model = target.split("/")[0] if target else "MODEL"
    return (f"no build writes this blob again ({build} made another artifact since): make and promote a new "
            f"release (`neuron-build release {model} && neuron-build promote {model} RELEASE --to CHANNEL`)")


def verify_store(store: LocalStore, deep: bool = False, repair: bool = False) -> VerifyReport:
    """Check every manifest of the action cache and every blob a manifest or a release lists.

    Cheap checks (a manifest parses, matches its own sha256, names its key, says PASS; every blob it
    lists is there with its size) always; ``deep`` also hashes every blob. A damaged blob is reported once,
    naming the keys whose manifests list it, every release and channel that pins it, and the fix. Only
    with ``repair`` is anything moved: damaged manifests and blobs go to ``quarantine/`` (so the next build
    compiles the keys again); without it, a read-only store is verified without a write.
    """
    rep = VerifyReport(deep=deep, repair=repair)
    pins = release_pins(store)
    blobs: dict[str, BadObject] = {}
    checked_blobs: dict[tuple[str, int], str | None] = {}

    def blob_check(sha: str, size: int) -> str | None:
        if (sha, size) not in checked_blobs:
            checked_blobs[(sha, size)] = store.blob_damage(sha, size, deep)
        return checked_blobs[(sha, size)]

    for key in store.keys():
        rep.checked += 1
        found = store.lookup(key, deep=deep)
        if found.hit:
            for ent in found.manifest.files.values():
                checked_blobs[(ent.sha256, ent.size)] = None
            rep.ok += 1
            continue
        raw = store.raw_manifest(key)
        target = raw.get("target") if isinstance(raw, dict) and isinstance(raw.get("target"), str) else None
        if found.blob is not None:
            bad = blobs.get(found.blob)
            if bad is None:
                who = pins.blobs.get(found.blob, [])
                bad = blobs[found.blob] = BadObject(found.blob, target, found.damage, kind="blob",
                                                    pinned_by=list(who), fix=blob_fix(target, found.damage, who))
                rep.bad.append(bad)
            bad.keys.append(key)
            if repair:
                store.quarantine(key, found.damage + " (found by verify --repair)")
            continue
        moved = (store.quarantine(key, found.damage + (" (found by verify --deep)" if deep else " (found by verify)"))
                 if repair else None)
        fix = f"`neuron-build build{' ' + target if target else ''}` compiles the key again"
        rep.bad.append(BadObject(key, target, found.damage, moved, kind="manifest", keys=[key], fix=fix))
    # blobs pinned by releases, whether or not a manifest still lists them
    for sha, who in pins.blobs.items():
        if sha in blobs:
            continue
        size = pins.sizes.get(sha)
        why = blob_check(sha, size) if size is not None else None
        if why is None:
            continue
        name, target = pins.names.get(sha), pins.targets.get(sha)
        blobs[sha] = BadObject(sha, target, f"{name}: {why}", kind="blob", pinned_by=list(who),
                               fix=orphan_blob_fix(target))
        rep.bad.append(blobs[sha])
    rep.blobs_checked = len({s for s, _ in checked_blobs})
    if repair:
        for sha, bad in blobs.items():
            if store.blob_size(sha) is not None:
                bad.moved_to = store.quarantine_blob(sha, bad.reason + " (found by verify --repair)")
    for model, rid, rel in store.releases():
        where = f"releases/{model}/{rid}.json"
        keys = _release_keys(rel)
        if keys is None:
            rep.problems.append(f"{where}: not a readable release (JSON with artifacts)")
            continue
        for tid, key in keys:
            if not store.is_complete(key):
                rep.problems.append(f"{where}: artifact {tid} key {key[:12]} is not complete in the store")
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


# ------------------------------------------------------------------------------------------------------
# gc

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
    """Something ``gc`` meant to remove and could not (``error``: the OS's reason), or a file it found
    outside the layout and left (``kind`` ``unknown``: gc never deletes what it did not write)."""

    kind: str
    path: str
    error: str


@dataclass
class GcReport:
    """What ``gc`` removed (or would remove), what it could not remove (``failed``: exit status 1) and
    what it left because it did not write it (``unknown``). ``referenced`` counts the keys kept as roots."""

    dry_run: bool
    keep_days: float
    referenced: int = 0
    kept_young: int = 0
    removed: list[Removal] = field(default_factory=list)
    failed: list[Unremoved] = field(default_factory=list)
    unknown: list[Unremoved] = field(default_factory=list)

    @property
    def bytes_freed(self) -> int:
        return sum(r.bytes for r in self.removed)

    def to_json(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "keep_days": self.keep_days, "referenced": self.referenced,
                "kept_young": self.kept_young, "bytes_freed": self.bytes_freed,
                "removed": [asdict(r) for r in self.removed], "failed": [asdict(f) for f in self.failed],
                "unknown": [asdict(u) for u in self.unknown]}


def referenced_keys(store: LocalStore, extra: Iterable[str] = (), current_targets: Iterable[str] | None = None
                    ) -> set[str]:
    """Keys that ``gc`` must keep: ``extra`` (the current matrix's keys), the keys the records of current
    targets name (every target record when ``current_targets`` is None), every release's keys.

    Raises:
        UserError: a release file is unreadable (its keys cannot be protected); the message names it.
    """
    keys = set(extra)
    cur = None if current_targets is None else set(current_targets)
    keys.update(rec.key for rec in store.all_targets() if cur is None or rec.target in cur)
    for model, rid, rel in store.releases():
        rk = _release_keys(rel)
        if rk is None:
            raise UserError(f"{store.path(layout.release_path(model, rid))}: release file is unreadable or has no "
                            f"artifacts list; gc cannot tell which artifacts it keeps. Fix or remove it, then run "
                            f"gc again")
        keys.update(k for _, k in rk)
    return keys


def collect_garbage(store: LocalStore, keep_keys: Iterable[str] = (), keep_days: float = 7.0, dry_run: bool = False,
                    now: float | None = None, current_targets: Iterable[str] | None = None) -> GcReport:
    """Remove what nothing needs, and say exactly what was removed and what could not be.

    - manifests (``ac/``) of keys that are no root (see :func:`referenced_keys`) and older than
      ``keep_days`` (age from the manifest's ``created``, else the file's mtime), with their logs, view,
      ``results/<key>/`` and lock files;
    - blobs (``cas/``) that no release pins and no kept manifest lists (a blob that no manifest lists at
      all is kept for an hour at least: a build may be publishing it);
    - views and logs of keys without a kept manifest; staging folders of builders that are no longer
      running on this host (any age), or from other hosts and older than ``keep_days``; quarantined
      objects older than ``keep_days``; lock files moved aside; temporary files older than an hour.

    Files inside the layout's areas that do not have the layout's names, and entries of the store folder
    that are no area, are never deleted: they are listed in ``unknown``. Removals are renames into
    ``trash/`` first (readers see an object whole or not at all), then deletes; anything that fails is
    listed in ``failed`` with its error. ``dry_run`` removes nothing and reports the same list.

    Args:
        keep_keys: keys to keep (the current matrix's keys).
        current_targets: the target ids of the current matrix: only their records keep keys alive (None:
            every target record does).

    Raises:
        UserError: ``keep_days`` is negative, or a release file is unreadable; the store is read-only.
    """
    if keep_days < 0:
        raise UserError(f"--keep-days {keep_days:g} is negative; give 0 or more days")
    if store.read_only and not dry_run:
        raise UserError(f"store at {store.location} is read-only; gc removes nothing there "
                        f"(run it where the store can be written, or with --dry-run)")
    now = time.time() if now is None else now
    horizon = keep_days * DAY_S
    rep = GcReport(dry_run=dry_run, keep_days=keep_days)
    refs = referenced_keys(store, keep_keys, current_targets)
    pins = release_pins(store)
    trash = store.area("trash")

    def drop(path: Path, item: Removal) -> bool:
        """Rename ``path`` into trash and delete it; record the removal or the failure."""
        if dry_run:
            rep.removed.append(item)
            return True
        try:
            trash.mkdir(parents=True, exist_ok=True)
            dest = trash / f"{path.name}.{secrets.token_hex(4)}"
            os.rename(path, dest)
        except FileNotFoundError:
            return False  # gone meanwhile (another gc): nothing removed by us
        except OSError as e:
            rep.failed.append(Unremoved(item.kind, item.path, f"{e.strerror or e} (left in place)"))
            return False
        err = _delete(dest)
        if err:
            rep.failed.append(Unremoved(item.kind, item.path, f"{err} (moved to {store.relative(dest)})"))
            return False
        rep.removed.append(item)
        return True

    def unknown(p: Path, why: str) -> None:
        rep.unknown.append(Unremoved("unknown", store.relative(p) or str(p), why))

    # the store folder: only the layout's areas are ours
    known = set(layout.SHARED_AREAS) | set(layout.LOCAL_AREAS) | {"views"}
    for p in sorted(store.root.iterdir()) if store.root.is_dir() else []:
        if p.name not in known:
            unknown(p, "not an area of the store layout; left as it is")

    # manifests
    kept: set[str] = set()
    dropped: set[str] = set()
    blob_users: dict[str, set[str]] = {}
    for sub in sorted(store.area("ac").iterdir()) if store.area("ac").is_dir() else []:
        for p in sorted(sub.iterdir()) if sub.is_dir() else [sub]:
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                continue  # a temporary file: handled with the others below
            key = p.name[:-5] if p.name.endswith(".json") else ""
            if not (sub.is_dir() and p.is_file() and layout.is_digest(key) and key[:2] == sub.name):
                unknown(p, "not an action-cache entry (ac/<key[:2]>/<key>.json); left as it is")
                continue
            raw = store.raw_manifest(key)
            files = raw.get("files") if isinstance(raw, dict) and isinstance(raw.get("files"), dict) else {}
            for ent in files.values():
                if isinstance(ent, dict) and isinstance(ent.get("sha256"), str):
                    blob_users.setdefault(ent["sha256"], set()).add(key)
            if key in refs:
                rep.referenced += 1
                kept.add(key)
                continue
            age = now - _created(raw, p)
            if age < horizon:
                rep.kept_young += 1
                kept.add(key)
                continue
            target = raw.get("target") if isinstance(raw, dict) else None
            extra = [store.path(layout.log_path(key, "x")).parent, store.view_dir(key), store.area("results") / key]
            size = tree_bytes(p) + sum(tree_bytes(x) for x in extra)
            if drop(p, Removal("object", store.relative(p), size,
                               f"no release, channel or current target references it; {age / DAY_S:.1f} days old",
                               key=key, target=target)):
                dropped.add(key)
                if not dry_run:
                    for x in extra:
                        if x.exists():
                            err = _delete(x)
                            if err:
                                rep.failed.append(Unremoved("object", store.relative(x), err))
                    _drop_lock_files(store, key)
            elif dry_run:
                dropped.add(key)
            else:
                kept.add(key)  # could not remove it: its blobs stay too

    # blobs
    live = {sha for sha, users in blob_users.items() if users & kept} | set(pins.blobs)
    for sub in sorted(store.area("cas").iterdir()) if store.area("cas").is_dir() else []:
        for p in sorted(sub.iterdir()) if sub.is_dir() else [sub]:
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                continue
            if not (sub.is_dir() and p.is_file() and layout.is_digest(p.name) and p.name[:2] == sub.name):
                unknown(p, "not a blob (cas/<sha[:2]>/<sha>); left as it is")
                continue
            if p.name in live:
                continue
            if p.name in blob_users:  # listed only by manifests removed above
                why = "listed only by artifacts gc removed"
            else:
                age = now - _mtime(p)
                if age < max(horizon, TMP_MAX_AGE_S):
                    continue
                why = f"listed by no manifest or release; {age / DAY_S:.1f} days old"
            drop(p, Removal("blob", store.relative(p), tree_bytes(p), why))

    # views and logs of keys without a kept manifest
    for area, kind in (("views", "view"), ("logs", "logs")):
        base = store.area(area)
        entries = ([d for sub in sorted(base.iterdir()) if sub.is_dir() for d in sorted(sub.iterdir())]
                   if area == "views" and base.is_dir() else sorted(base.iterdir()) if base.is_dir() else [])
        for d in entries:
            key = d.name
            if d.name.startswith(".") and area == "views":  # a view being built, or an interrupted build
                if now - _mtime(d) >= TMP_MAX_AGE_S:
                    drop(d, Removal(kind, store.relative(d), tree_bytes(d), "left by an interrupted view build"))
                continue
            if not (d.is_dir() and layout.is_digest(key) and (area != "views" or key[:2] == d.parent.name)):
                unknown(d, f"not a {kind} folder of a key; left as it is")
                continue
            if key in kept or key in dropped:
                continue
            drop(d, Removal(kind, store.relative(d), tree_bytes(d), "its key has no artifact", key=key))

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
    for area in ("ac", "cas", "logs", "targets", "results", "locks", "releases", "channels"):
        abase = store.area(area)
        for p in sorted(abase.rglob(".*.tmp")) if abase.is_dir() else []:
            if now - _mtime(p) >= TMP_MAX_AGE_S:
                drop(p, Removal("temp", store.relative(p), tree_bytes(p), "temporary file left by a killed writer"))
    rep.removed += collect_failure_workdirs(store, dry_run=dry_run)
    if not dry_run and trash.is_dir():
        for p in trash.iterdir():
            err = _delete(p)
            if err:
                rep.failed.append(Unremoved("trash", store.relative(p), err))
    return rep


def _delete(path: Path) -> str | None:
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


def _created(man: Any, p: Path) -> float:
    if isinstance(man, dict) and isinstance(man.get("created"), str):
        try:
            t = _dt.datetime.fromisoformat(man["created"])
            if t.tzinfo is None:
                t = t.replace(tzinfo=_dt.timezone.utc)
            return t.timestamp()
        except ValueError:
            pass
    return _mtime(p)


def _mtime(p: Path) -> float:
    try:
        return p.lstat().st_mtime
    except OSError:
        return time.time()


__all__ = ["verify_store", "VerifyReport", "BadObject", "collect_failure_workdirs", "collect_garbage", "GcReport",
           "Removal", "Unremoved", "referenced_keys", "release_pins", "tree_bytes"]
