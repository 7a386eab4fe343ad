"""``verify``: every manifest and blob of a store against its digests, every release and channel against
what it names, every record against its kind. Damage is reported with what it breaks (the keys that list
a blob, the releases and channels that pin it) and the fix; it is moved to quarantine only with
``repair``. The collector is :mod:`neuron_build.store.gc`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_build.errors import StoreError
from neuron_build.store import layout
from neuron_build.store.gc import release_artifacts
from neuron_build.store.local import LocalStore


def _release_keys(rel: Any) -> list[tuple[str, str]] | None:
    """[(target, key)] of a release record, or None when it is not one."""
    arts = release_artifacts(rel)
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
        for a in release_artifacts(rel) or []:
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

    ``kind``: ``manifest`` (an action-cache entry: unreadable, edited, another key, not PASS), ``blob``
    (a file's content: missing, another size, another digest) or ``record`` (a record beside them that does
    not parse as its kind: :func:`check_records`). ``key``: the key (manifest), sha256 (blob) or the
    record's path in the store. ``keys``: the keys whose manifests list a damaged blob. ``pinned_by``: the releases and
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


#: What ``verify`` without ``--deep`` does not see, and how to see it.
NOT_HASHED = "a blob changed in place at the same size passes; --deep hashes every blob"


@dataclass
class VerifyReport:
    """What ``verify`` found. ``problems`` are reference faults: a release naming a key with no complete
    artifact, a channel naming a release that does not exist or does not parse."""

    deep: bool
    repair: bool = False
    checked: int = 0
    ok: int = 0
    blobs_checked: int = 0
    records_checked: int = 0
    bad: list[BadObject] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.bad and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"deep": self.deep, "repair": self.repair, "checked": self.checked, "ok": self.ok,
                "blobs_checked": self.blobs_checked, "records_checked": self.records_checked, "clean": self.clean,
                "bad": [asdict(b) for b in self.bad], "problems": self.problems,
                "not_checked": None if self.deep else "blob contents (sha256): --deep hashes every blob"}


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


def verify_store(store: LocalStore, deep: bool = False, repair: bool = False,
                 shared: Any = None) -> VerifyReport:
    """Check every manifest of the action cache and every blob a manifest or a release lists.

    Cheap checks (a manifest parses, matches its own sha256, names its key, says PASS; every blob it
    lists is there with its size) always; ``deep`` also hashes every blob. A damaged blob is reported once,
    naming the keys whose manifests list it, every release and channel that pins it, and the fix. Only
    with ``repair`` is anything moved: damaged manifests and blobs go to ``quarantine/`` (so the next build
    compiles the keys again); without it, a read-only store is verified without a write.

    Args:
        shared: the remote store ``store`` is the local cache of (``[build] remote``), or None. Releases
            live on the remote and ``promote`` mirrors only the channel pointer into the local store, so a
            local channel's release is looked up on ``shared`` too (a remote that cannot be read counts as
            not holding it).
    """
    rep = VerifyReport(deep=deep, repair=repair)
    pins = release_pins(store)
    blobs: dict[str, BadObject] = {}
    checked_blobs: dict[tuple[str, int], str | None] = {}
    _check_manifests(store, rep, pins, blobs, checked_blobs)
    _check_pinned_blobs(store, rep, pins, blobs, checked_blobs)
    rep.blobs_checked = len({s for s, _ in checked_blobs})
    if repair:
        for sha, bad in blobs.items():
            if store.blob_size(sha) is not None:
                bad.moved_to = store.quarantine_blob(sha, bad.reason + " (found by verify --repair)")
    rep.problems.extend(_reference_problems(store, shared))
    rep.records_checked, bad_records = check_records(store)
    rep.bad.extend(bad_records)
    return rep


def _check_manifests(store: LocalStore, rep: VerifyReport, pins: Pins, blobs: dict[str, BadObject],
                     checked_blobs: dict[tuple[str, int], str | None]) -> None:
    """Every key of the action cache: a complete artifact (its blobs noted as checked in ``checked_blobs``),
    a damaged blob (one :class:`BadObject` per blob in ``blobs``, naming every key that lists it) or a
    damaged manifest. With ``rep.repair``, the damaged keys are quarantined."""
    deep, repair = rep.deep, rep.repair
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


def _check_pinned_blobs(store: LocalStore, rep: VerifyReport, pins: Pins, blobs: dict[str, BadObject],
                        checked_blobs: dict[tuple[str, int], str | None]) -> None:
    """The blobs releases pin, whether or not a manifest still lists them (each checked once)."""
    for sha, who in pins.blobs.items():
        if sha in blobs:
            continue
        size = pins.sizes.get(sha)
        if size is None:
            continue
        if (sha, size) not in checked_blobs:
            checked_blobs[(sha, size)] = store.blob_damage(sha, size, rep.deep)
        why = checked_blobs[(sha, size)]
        if why is None:
            continue
        name, target = pins.names.get(sha), pins.targets.get(sha)
        blobs[sha] = BadObject(sha, target, f"{name}: {why}", kind="blob", pinned_by=list(who),
                               fix=orphan_blob_fix(target))
        rep.bad.append(blobs[sha])


def _reference_problems(store: LocalStore, shared: Any) -> list[str]:
    """Reference faults: a release naming a key with no complete artifact, or not a release at all; a
    channel naming a release that neither ``store`` nor ``shared`` holds."""
    problems = []
    for model, rid, rel in store.releases():
        where = layout.release_path(model, rid)
        keys = _release_keys(rel)
        if keys is None:
            problems.append(f"{where}: not a readable release (JSON with artifacts)")
            continue
        for tid, key in keys:
            if not store.is_complete(key):
                problems.append(f"{where}: artifact {tid} key {key[:12]} is not complete in the store")
    for model, channel, ch in store.channels():
        where = layout.channel_path(model, channel)
        rid = ch.get("release") if isinstance(ch, dict) else None
        if not isinstance(rid, str):
            problems.append(f"{where}: not a readable channel (JSON with release)")
            continue
        if _release_keys(store.release(model, rid)) is None and _release_keys(_shared_release(shared, model, rid)) is None:
            problems.append(f"{where}: points at release {rid}, "
                            f"but {layout.release_path(model, rid)} is missing or unreadable")
    return problems


def _is_history_entry(raw: Any) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("action"), str)


def _is_validation(raw: Any) -> bool:
    from neuron_build.status import Verdict

    return isinstance(raw, dict) and raw.get("verdict") in {v.value for v in Verdict}


def _is_ledger_object(raw: Any) -> bool:
    """One ledger record, or a batch ``{"schema", "records": [...]}`` of them (as :func:`ledger.read` reads)."""
    from neuron_build.store.ledger import LedgerRecord

    batch = raw.get("records") if isinstance(raw, dict) and isinstance(raw.get("records"), list) else [raw]
    return bool(batch) and all(LedgerRecord.from_json(r) is not None for r in batch)


def _record_kind(rel: str) -> tuple[str, Any] | None:
    """(what the record at ``rel`` is, a check of its parsed JSON) for the records :func:`check_records`
    reads; None for what is not a JSON record (logs, artifact files, kept workdirs, quarantine)."""
    from neuron_build.store.graph_index import GraphEntry
    from neuron_build.store.records import FailureRecord, TargetRecord

    parts = rel.split("/")
    name, area = parts[-1], parts[0]
    if not name.endswith(".json"):
        return None
    if area == layout.TARGETS_DIR:
        return {"last.json": ("target record", lambda r: TargetRecord.from_json(r) is not None),
                "failure.json": ("failure record", lambda r: FailureRecord.from_json(r) is not None),
                "imports.json": ("recorded imports", lambda r: isinstance(r, dict) and isinstance(r.get("files"), list)),
                "reads.json": ("recorded reads", lambda r: isinstance(r, dict))}.get(name)
    if area == layout.RESULTS_DIR and len(parts) == 4:
        return ("validation result", _is_validation) if parts[2] == "validation" else (
            f"{parts[2]} result", lambda r: isinstance(r, dict))
    if area == layout.CHANNELS_DIR and len(parts) == 4 and parts[2].endswith(".history"):
        return "history entry", _is_history_entry
    if area == layout.LEDGER_DIR:
        return "ledger record", _is_ledger_object
    if area == layout.GRAPHS_DIR and len(parts) == 3:
        return "graph index entry", lambda r: GraphEntry.from_json(r, name[:-5]) is not None
    if area == layout.LEASES_DIR and len(parts) == 2:
        return "lease", lambda r: isinstance(r, dict)
    if area == layout.FAILURES_DIR and name == "entry.json" and len(parts) == 4:
        return "kept failure entry", lambda r: isinstance(r, dict)
    if rel == layout.STORE_ID_PATH:
        return "store identity", lambda r: isinstance(r, dict)
    return None


#: The areas of :func:`check_records` (releases and channel pointers are checked as references).
RECORD_AREAS = (layout.TARGETS_DIR, layout.RESULTS_DIR, layout.CHANNELS_DIR, layout.LEDGER_DIR, layout.GRAPHS_DIR,
                layout.LEASES_DIR, layout.FAILURES_DIR)


def check_records(store: Any) -> tuple[int, list[BadObject]]:
    """Parse every record the store holds besides manifests, blobs, releases and channel pointers: target
    records (``targets/<target id>/last.json``, ``failure.json``), recorded imports and reads, validation
    and benchmark results, history entries, ledger records, graph index entries, leases, kept failure
    entries, the store identity. Each must be JSON of its kind (read as the code that uses it reads it).

    Returns:
        (records checked, one :class:`BadObject` of kind ``record`` per record that does not parse, with
        the path as its ``key`` and the fix).
    """
    checked, bad = 0, []
    rels = [r for area in RECORD_AREAS for r in store.list_objects(area)]
    if store.get_object(layout.STORE_ID_PATH) is not None:
        rels.append(layout.STORE_ID_PATH)
    for rel in rels:
        kind = _record_kind(rel)
        if kind is None:
            continue
        what, ok = kind
        checked += 1
        data = store.get_object(rel)
        if data is None:
            continue  # removed meanwhile
        try:
            raw = json.loads(data)
        except ValueError:
            why = "not JSON"
        else:
            why = None if ok(raw) else f"JSON, but not a {what}"
        if why is None:
            continue
        target = "/".join(rel.split("/")[1:-1]) if rel.startswith(layout.TARGETS_DIR + "/") else None
        bad.append(BadObject(rel, target, f"{what}: {why}", kind="record", fix=_record_fix(rel, target)))
    return checked, bad


def _record_fix(rel: str, target: str | None) -> str:
    if rel.startswith(layout.TARGETS_DIR + "/") and rel.endswith("/last.json"):
        return f"`neuron-build build {target}` writes it again (a cached target too); or remove {rel}"
    if rel.startswith(layout.RESULTS_DIR + "/"):
        return f"`neuron-build validate` (or bench) writes it again; or remove {rel}"
    if rel.startswith(layout.CHANNELS_DIR + "/"):
        return f"a history entry is written once: move {rel} aside (the channel's history then lacks it)"
    return f"remove {rel} (it is rewritten or not needed)"


def _shared_release(shared: Any, model: str, rid: str) -> Any:
    """The release record ``rid`` of ``model`` on ``shared`` (None without one, or when it cannot be read)."""
    if shared is None:
        return None
    try:
        return shared.release(model, rid)
    except (StoreError, OSError):
        return None


__all__ = ["NOT_HASHED", "BadObject", "Pins", "RECORD_AREAS", "VerifyReport", "blob_fix", "check_records", "orphan_blob_fix",
           "release_pins", "verify_store"]
