"""``gc --remote``: collect a shared store through the contract (it has no folders to walk or rename).

Roots are what must never go: the artifacts every release pins (so every channel's release), and the keys
the caller names (the current targets of the checkout that runs gc). Other action-cache entries are
removed once older than the keep window; then blobs that no remaining entry and no release names, again
only when older than the window, so a blob a concurrent builder has just uploaded (its manifest not
written yet) is never taken. The manifest goes first, so no reader is ever left with an entry whose blob
is gone. A shared bucket serves many checkouts: entries of other branches stay until they age out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neuron_build.store import layout
from neuron_build.store.maintenance import GcReport, Removal, Unremoved, _release_artifacts

DAY_S = 86400.0


def _age(store: Any, path: str) -> float | None:
    age = getattr(store, "object_age", None)
    return age(path) if age is not None else None


def collect_remote_garbage(store: Any, keep_keys: Iterable[str] = (), keep_days: float = 7.0,
                           dry_run: bool = False) -> GcReport:
    """Remove unreferenced action-cache entries (with their logs and results) and unreferenced blobs
    older than ``keep_days`` days from a remote store.

    Args:
        store: a :class:`~neuron_build.store.remote.RemoteStore` (any store with the contract's
            ``ObjectIO`` and ``object_age``).
        keep_keys: keys never removed (the current targets' keys).
        dry_run: report what would go; remove nothing.

    Returns:
        The report: every removal with its reason and size in bytes, and what could not be removed.
    """
    rep = GcReport(dry_run=dry_run, keep_days=keep_days)
    window = keep_days * DAY_S
    roots = set(keep_keys)
    pinned: set[str] = set()
    for _model, _rid, rel in store.releases():
        for art in _release_artifacts(rel) or []:
            if isinstance(art.get("key"), str):
                roots.add(art["key"])
            for ent in (art.get("files") or {}).values():
                if isinstance(ent, dict) and isinstance(ent.get("sha256"), str):
                    pinned.add(ent["sha256"])

    def remove(path: str, removal: Removal) -> bool:
        if not dry_run:
            try:
                if not store.delete_object(path):
                    return False
            except Exception as e:
                rep.failed.append(Unremoved(removal.kind, path, str(e).splitlines()[0] if str(e) else type(e).__name__))
                return False
        rep.removed.append(removal)
        return True

    alive: set[str] = set(pinned)
    for key in store.keys():
        raw = store.raw_manifest(key)
        files = [e for e in ((raw or {}).get("files") or {}).values() if isinstance(e, dict)]
        path = layout.manifest_path(key)
        age = _age(store, path)
        if key in roots or age is None or age < window:
            rep.referenced += key in roots
            rep.kept_young += key not in roots
            alive.update(e["sha256"] for e in files if isinstance(e.get("sha256"), str))
            continue
        target = (raw or {}).get("target")
        why = f"no release pins it and no current target has it; {age / DAY_S:.1f} days old"
        if not remove(path, Removal("object", path, sum(int(e.get("size", 0)) for e in files), why,
                                    key=key, target=target if isinstance(target, str) else None)):
            alive.update(e["sha256"] for e in files if isinstance(e.get("sha256"), str))
            continue
        for extra in store.list_objects(f"logs/{key}") + store.list_objects(f"results/{key}"):
            remove(extra, Removal("logs", extra, 0, f"belongs to removed key {key[:12]}", key=key))
    for path in store.list_objects("cas"):
        sha = path.rsplit("/", 1)[-1]
        if sha in alive or not layout.is_digest(sha):
            continue
        age = _age(store, path)
        if age is None or age < window:
            continue
        remove(path, Removal("blob", path, store.blob_size(sha) or 0,
                             f"no entry and no release names it; {age / DAY_S:.1f} days old"))
    return rep


__all__ = ["collect_remote_garbage"]
