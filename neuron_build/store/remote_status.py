"""``neuron-build status [--remote]``: what this host's store holds against ``[build] remote``, the way
``dvc status -c`` compares a cache with its remote. Reads only: nothing is copied, moved or repaired.

Without the remote (:func:`local_status`): the current targets built here and missing here, and the pushes
earlier builds left pending (``pending-push/<key>`` markers of the read-through store). With it
(:func:`remote_status`): also the artifacts built here that the remote lacks (``push`` uploads them), the
artifacts the remote holds that this host lacks (current targets' and those its releases pin: ``fetch``
downloads them), the release records on one side only, and the channels whose local and remote pointers
differ (a local pointer is the copy ``fetch`` last took).
"""

from __future__ import annotations

from typing import Any

from neuron_build.store.contract import ArtifactStore
from neuron_build.store.layout import PENDING_DIR


def _pending(local: ArtifactStore, names: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for path in local.list_objects(PENDING_DIR):
        key = path.rsplit("/", 1)[-1]
        raw = local.get_object(path) or b""
        out.append({"key": key, "target": names.get(key),
                    "reason": raw.decode(errors="replace").strip().splitlines()[0] if raw.strip() else None})
    return out


def _release_keys(store: ArtifactStore) -> tuple[dict[str, str], set[str]]:
    """({key: target id} pinned by the store's releases, {"model@release id"})."""
    keys: dict[str, str] = {}
    ids: set[str] = set()
    for model, rid, record in store.releases():
        ids.add(f"{model}@{rid}")
        for art in (record or {}).get("artifacts") or []:
            if isinstance(art, dict) and isinstance(art.get("key"), str):
                keys.setdefault(art["key"], str(art.get("target") or ""))
    return keys, ids


def _held(store: ArtifactStore, key: str, stale: Any) -> tuple[bool, list[str]]:
    """Does ``store`` hold a complete artifact of ``key`` whose recorded inputs still match (``stale``:
    manifest -> the lines of what changed; None: not checked)? And what changed, when stale (or how the
    object is damaged)."""
    found = store.lookup(key)
    if found.damage is not None:  # a truncated or edited object: not built here, and said why
        return False, [f"artifact damaged: {found.damage}; a build makes it again"]
    why = list(stale(found.manifest)) if found.hit and stale is not None else []
    return found.hit and not why, why


def local_status(local: ArtifactStore, targets: dict[str, str], stale: Any = None) -> dict[str, Any]:
    """The status of this host's store alone.

    Args:
        local: the local store (the read-through store's ``local``, or the store when there is no remote).
        targets: target id -> its current key.
        stale: manifest -> why it is stale (the recorded inputs that changed since its build: a stale
            artifact is not built here; its row lists them as ``stale``); None: not checked.

    Returns:
        ``{"local", "targets": [{"target", "key", "here", "stale"?}], "built_here", "missing_here" (target ids),
        "pending_pushes": [{"key", "target", "reason"}]}``.
    """
    names = {k: t for t, k in targets.items()}
    rows = []
    for t, k in targets.items():
        here, why = _held(local, k, stale)
        rows.append({"target": t, "key": k, "here": here, **({"stale": why} if why else {})})
    return {"local": local.location, "targets": rows,
            "built_here": [r["target"] for r in rows if r["here"]],
            "missing_here": [r["target"] for r in rows if not r["here"]],
            "pending_pushes": _pending(local, names)}


def _pointer(p: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(p, dict) or not isinstance(p.get("release"), str):
        return None
    return {"release": p["release"], "version": p.get("version"), "time": p.get("time")}


def remote_status(local: ArtifactStore, remote: ArtifactStore, targets: dict[str, str],
                  stale: Any = None) -> dict[str, Any]:
    """:func:`local_status` and the comparison with ``remote``.

    Returns:
        :func:`local_status`'s fields, each target row with ``remote`` (complete on the remote) too, and
        ``"remote"`` (its location), ``"not_pushed"`` and ``"remote_only"`` (``[{"key", "target"}]``: the
        target id, or the release's target for a key only a release pins), ``"releases": {"not_pushed",
        "remote_only"}`` (``model@id``), ``"channels": [{"model", "channel", "local", "remote", "state"}]``
        (every channel either side holds; ``state``: ``same``, ``differs``, ``local only``, ``remote only``;
        pointers as ``{"release", "version", "time"}``).

    Raises:
        OSError or a store error: the remote cannot be read (the caller says so in one line).
    """
    doc = local_status(local, targets, stale)
    names = {k: t for t, k in targets.items()}
    for row in doc["targets"]:
        row["remote"] = _held(remote, row["key"], stale)[0]
    local_pins, local_ids = _release_keys(local)
    remote_pins, remote_ids = _release_keys(remote)
    not_pushed = [{"key": r["key"], "target": r["target"]} for r in doc["targets"] if r["here"] and not r["remote"]]
    remote_only = [{"key": r["key"], "target": r["target"]} for r in doc["targets"] if r["remote"] and not r["here"]]
    seen = {r["key"] for r in doc["targets"]}
    for key, target in local_pins.items():
        if key not in seen and local.lookup(key).hit and not remote.lookup(key).hit:
            not_pushed.append({"key": key, "target": names.get(key) or target or None})
        seen.add(key)
    for key, target in remote_pins.items():
        if key not in seen and not local.lookup(key).hit and remote.lookup(key).hit:
            remote_only.append({"key": key, "target": names.get(key) or target or None})
    channels = []
    pairs = sorted({(m, c) for m, c, _ in local.channels()} | {(m, c) for m, c, _ in remote.channels()})
    for model, channel in pairs:
        mine, theirs = _pointer(local.channel(model, channel)), _pointer(remote.channel(model, channel))
        if mine is None:
            state = "remote only"
        elif theirs is None:
            state = "local only"
        else:
            same = (mine["release"], mine["version"]) == (theirs["release"], theirs["version"])
            state = "same" if same else "differs"
        channels.append({"model": model, "channel": channel, "local": mine, "remote": theirs, "state": state})
    return {**doc, "remote": remote.location, "not_pushed": not_pushed, "remote_only": remote_only,
            "releases": {"not_pushed": sorted(local_ids - remote_ids), "remote_only": sorted(remote_ids - local_ids)},
            "channels": channels}


__all__ = ["local_status", "remote_status"]
