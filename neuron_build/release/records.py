"""Release records, channel pointers and history entries: typed models and the code that makes and reads them.

Domain code: no doit, no torch. What the store keeps (through :class:`~neuron_build.store.contract.ArtifactStore`;
layout in ``docs/releases.md``, "What each command does")::

    releases/<model>/<release id>.json        immutable release records (:class:`Release`)
    channels/<model>/<channel>.json           the channel pointer (:class:`ChannelPointer`)
    channels/<model>/<channel>.history/<entry>.json   one object per promotion, refusal and rollback
                                              (:class:`HistoryEntry`)

A **release** names the artifact keys of all of one model's buckets for one dtype, profile and backend,
with their files, the toolchain, what the runtime needs (input specs, pad values, serving options) and
summary metrics. Its id is ``r-`` + the first 16 hex digits of the sha256 over the canonical JSON of its
content (model, dtype, profile, backend, hardware target, artifacts, toolchain, runtime): releasing the
same artifacts twice gives the same id, and the record first written stays (created time, creator, git
commit and metrics are not part of the id).

Each model reads the JSON the store has always held (``from_json`` returns None for a record of another
shape: a damaged record is a miss, never a crash) and writes it back field for field, in the same key
order (``to_json``); keys a model does not know are kept, after the known ones. The functions that return
records to the CLI (:func:`create_release`, :func:`load_release`, :func:`channel_pointer`,
:func:`channel_history`) return that JSON form; the ``get_*`` and ``find_*`` functions return the models.
"""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import canonical_json, sha256_hex

RELEASE_FORMAT = 1

#: The fields of a release record that its id is derived from.
ID_FIELDS = ("format", "model", "dtype", "profile", "backend", "hardware_target", "artifacts", "toolchain",
             "runtime")


def _is(raw: Any, **types: type | tuple[type, ...]) -> bool:
    return isinstance(raw, dict) and all(isinstance(raw.get(k), t) for k, t in types.items())


def _extra(raw: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in known}


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any, default: int = 0) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


# --------------------------------------------------------------------------------------------------
# typed records

@dataclass(frozen=True)
class ReleaseArtifact:
    """One bucket of a release.

    Attributes:
        target: the target id (``tiny/b1/fp32/p1``).
        key: the artifact key (64 hex chars).
        bucket: bucket dim -> size (``{"batch": 1}``).
        bucket_id: the bucket's id (``b1``), the folder a pull writes it into.
        inputs: the concrete input specs (``name``, ``shape`` ints, ``dtype``, ...).
        files: file name -> ``{"sha256", "size"}`` (size in bytes), as the artifact's manifest lists them.
        artifact: the loadable model file; ``loader``: how to load it (:mod:`neuron_build.artifact`).
    """

    target: str
    key: str
    bucket: dict[str, Any]
    bucket_id: str
    inputs: list[dict[str, Any]]
    files: dict[str, dict[str, Any]]
    artifact: str
    loader: str
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("target", "key", "bucket", "bucket_id", "inputs", "files", "artifact", "loader")

    @classmethod
    def from_json(cls, raw: Any) -> ReleaseArtifact | None:
        """The artifact entry in ``raw``, or None when ``raw`` is not one (no string ``target``, ``key``,
        ``bucket_id`` or no ``files`` table)."""
        if not _is(raw, target=str, key=str, bucket_id=str, files=dict):
            return None
        return cls(target=raw["target"], key=raw["key"],
                   bucket=raw.get("bucket") if isinstance(raw.get("bucket"), dict) else {},
                   bucket_id=raw["bucket_id"],
                   inputs=raw.get("inputs") if isinstance(raw.get("inputs"), list) else [],
                   files=raw["files"], artifact=str(raw.get("artifact") or ""), loader=str(raw.get("loader") or ""),
                   extra=_extra(raw, cls._FIELDS))

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "key": self.key, "bucket": self.bucket, "bucket_id": self.bucket_id,
                "inputs": self.inputs, "files": self.files, "artifact": self.artifact, "loader": self.loader,
                **self.extra}


@dataclass(frozen=True)
class Release:
    """An immutable release record: ``releases/<model>/<id>.json``.

    Attributes:
        id: ``r-`` + 16 hex digits (:func:`release_id` of :meth:`content`).
        format: :data:`RELEASE_FORMAT`.
        model, dtype, profile, backend, hardware_target: what was released.
        artifacts: one entry per bucket.
        toolchain: package -> version of the toolchain every bucket was built with.
        runtime: what serving needs: ``dims``, ``inputs`` (``name``, symbolic ``shape``, ``dtype``, ``pad``),
            ``truncate``, ``convert_dtypes``; for the compile-cache and torchneuron backends also ``serving``
            (the model's ``factory``, ``kwargs``, ``dtype``, the ``torch_compile`` settings, the ``env`` to set
            and the ``device``: see :func:`neuron_build.compilers.compile_cache.serving_settings`).
        metrics: ``op_count_total``, ``compile_time_p95_s`` and ``compile_time_max_s`` (seconds),
            ``artifact_bytes_total`` (bytes) and ``artifacts`` (target id -> per-bucket summary).
        git_commit, git_dirty: the checkout it was made from (None outside git).
        created: ISO 8601 UTC time; creator: who made it (:func:`actor`).
    """

    id: str
    format: int
    model: str
    dtype: str
    profile: str
    backend: str
    hardware_target: str
    artifacts: tuple[ReleaseArtifact, ...]
    toolchain: dict[str, Any]
    runtime: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    git_commit: str | None = None
    git_dirty: bool | None = None
    created: str = ""
    creator: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("id",) + ID_FIELDS + ("metrics", "git_commit", "git_dirty", "created", "creator")

    @classmethod
    def from_json(cls, raw: Any) -> Release | None:
        """The release in ``raw``, or None when ``raw`` is not one (no string ``id`` or ``model``, or an
        ``artifacts`` list with an entry that is not one)."""
        if not _is(raw, id=str, model=str, artifacts=list):
            return None
        arts = [ReleaseArtifact.from_json(a) for a in raw["artifacts"]]
        if any(a is None for a in arts):
            return None
        dirty = raw.get("git_dirty")
        return cls(id=raw["id"], format=_int(raw.get("format"), RELEASE_FORMAT), model=raw["model"],
                   dtype=str(raw.get("dtype", "")), profile=str(raw.get("profile", "")),
                   backend=str(raw.get("backend", "")), hardware_target=str(raw.get("hardware_target", "")),
                   artifacts=tuple(arts),  # type: ignore[arg-type]
                   toolchain=raw.get("toolchain") if isinstance(raw.get("toolchain"), dict) else {},
                   runtime=raw.get("runtime") if isinstance(raw.get("runtime"), dict) else {},
                   metrics=raw.get("metrics") if isinstance(raw.get("metrics"), dict) else {},
                   git_commit=_str_or_none(raw.get("git_commit")),
                   git_dirty=dirty if isinstance(dirty, bool) else None,
                   created=str(raw.get("created") or ""), creator=str(raw.get("creator") or ""),
                   extra=_extra(raw, cls._FIELDS))

    def content(self) -> dict[str, Any]:
        """The fields the id is derived from (:data:`ID_FIELDS`), as JSON."""
        return {"format": self.format, "model": self.model, "dtype": self.dtype, "profile": self.profile,
                "backend": self.backend, "hardware_target": self.hardware_target,
                "artifacts": [a.to_json() for a in self.artifacts], "toolchain": self.toolchain,
                "runtime": self.runtime}

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self.content(), "metrics": self.metrics, "git_commit": self.git_commit,
                "git_dirty": self.git_dirty, "created": self.created, "creator": self.creator, **self.extra}

    @property
    def keys(self) -> dict[str, str]:
        """Target id -> artifact key, in bucket order."""
        return {a.target: a.key for a in self.artifacts}


@dataclass(frozen=True)
class ChannelPointer:
    """The release a channel holds: ``channels/<model>/<channel>.json``, swapped under the channel lock.

    Attributes:
        model, channel: whose pointer.
        release: the release id it holds.
        version: 1 for the first promotion, +1 per promotion or rollback (the compare-and-swap token).
        previous: the release it held before (None: it was empty).
        action: ``promote`` or ``rollback``; time (ISO 8601 UTC), who and reason: of that action.
    """

    model: str
    channel: str
    release: str
    version: int = 0
    previous: str | None = None
    action: str | None = None
    time: str | None = None
    who: str | None = None
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("model", "channel", "release", "version", "previous", "action", "time", "who", "reason")

    @classmethod
    def from_json(cls, raw: Any) -> ChannelPointer | None:
        """The pointer in ``raw``, or None when ``raw`` is not one (no string ``release``)."""
        if not _is(raw, release=str):
            return None
        return cls(model=str(raw.get("model", "")), channel=str(raw.get("channel", "")), release=raw["release"],
                   version=_int(raw.get("version")), previous=_str_or_none(raw.get("previous")),
                   action=_str_or_none(raw.get("action")), time=_str_or_none(raw.get("time")),
                   who=_str_or_none(raw.get("who")), reason=str(raw.get("reason") or ""),
                   extra=_extra(raw, cls._FIELDS))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "channel": self.channel, "release": self.release, "version": self.version,
                "previous": self.previous, "action": self.action, "time": self.time, "who": self.who,
                "reason": self.reason, **self.extra}


@dataclass(frozen=True)
class HistoryEntry:
    """One entry of a channel's history (``channels/<model>/<channel>.history/<entry>.json``, one object each):
    a promotion, a refused one, or a rollback.

    Attributes:
        time (ISO 8601 UTC), who, action (``promote``, ``refuse``, ``rollback``), model, channel.
        from_: the release the channel held (JSON ``from``; None: it was empty); to: the release it moves to.
        source: promotions only: ``{"release": id}`` or ``{"channel", "version"}`` it was taken from.
        reason: free text.
        device_kind, allow_unvalidated, gates: promotions only: the serving device kind the gates read
            results for, the override, and every gate's verdict (``GateCheck.to_json()``).
        refused: refusals only: why.
        version: the channel's version after it (a refusal: the version it was refused at).

    A field that is None is absent from the JSON (``from`` is always written).
    """

    time: str | None
    who: str | None
    action: str
    model: str
    channel: str
    from_: str | None
    to: str | None
    source: dict[str, Any] | None = None
    reason: str = ""
    device_kind: str | None = None
    allow_unvalidated: bool | None = None
    gates: list[dict[str, Any]] | None = None
    refused: str | None = None
    version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _FIELDS = ("time", "who", "action", "model", "channel", "from", "to", "source", "reason", "device_kind",
               "allow_unvalidated", "gates", "refused", "version")

    @classmethod
    def from_json(cls, raw: Any) -> HistoryEntry | None:
        """The entry in ``raw``, or None when ``raw`` is not one (no string ``action``)."""
        if not _is(raw, action=str):
            return None
        allow = raw.get("allow_unvalidated")
        version = raw.get("version")
        return cls(time=_str_or_none(raw.get("time")), who=_str_or_none(raw.get("who")), action=raw["action"],
                   model=str(raw.get("model", "")), channel=str(raw.get("channel", "")),
                   from_=_str_or_none(raw.get("from")), to=_str_or_none(raw.get("to")),
                   source=raw.get("source") if isinstance(raw.get("source"), dict) else None,
                   reason=str(raw.get("reason") or ""), device_kind=_str_or_none(raw.get("device_kind")),
                   allow_unvalidated=allow if isinstance(allow, bool) else None,
                   gates=raw.get("gates") if isinstance(raw.get("gates"), list) else None,
                   refused=_str_or_none(raw.get("refused")),
                   version=version if isinstance(version, int) and not isinstance(version, bool) else None,
                   extra=_extra(raw, cls._FIELDS))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"time": self.time, "who": self.who, "action": self.action, "model": self.model,
                               "channel": self.channel, "from": self.from_, "to": self.to}
        if self.source is not None:
            out["source"] = self.source
        out["reason"] = self.reason
        for k, v in (("device_kind", self.device_kind), ("allow_unvalidated", self.allow_unvalidated),
                     ("gates", self.gates), ("refused", self.refused), ("version", self.version)):
            if v is not None:
                out[k] = v
        out.update(self.extra)
        return out


# --------------------------------------------------------------------------------------------------
# small helpers

def actor() -> str:
    """Who acts: ``$NEURON_BUILD_ACTOR`` when set (e.g. the CI user), else ``user@host``."""
    env = os.environ.get("NEURON_BUILD_ACTOR")
    if env:
        return env
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):  # no login name, no passwd entry for the uid
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def git_state(folder: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding ``folder``; (None, None) when it is not one or git is
    missing. ``dirty`` is True when ``git status --porcelain`` lists anything."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                              timeout=30, check=False)
        if head.returncode != 0:
            return None, None
        st = subprocess.run(["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True,
                            timeout=60, check=False)
        return head.stdout.strip(), (bool(st.stdout.strip()) if st.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def check_channel(settings, channel: str, flag: str) -> None:
    """Raise :class:`UserError` (naming ``flag`` and the declared channels) unless ``channel`` is declared
    under ``[release]`` (``settings``: :class:`neuron_build.project.config.ReleaseSettings`)."""
    if channel not in settings.channels:
        raise UserError(f"unknown channel '{channel}' ({flag}); channels under [release] in buckets.toml: "
                        f"{', '.join(settings.channels)}")


def release_id(content: dict[str, Any]) -> str:
    """``r-`` + the first 16 hex digits of the sha256 over the canonical JSON of ``content``."""
    return "r-" + sha256_hex(canonical_json(content))[:16]


def results_speak_for(store: ArtifactStore, art: ReleaseArtifact) -> str | None:
    """Why the store's results under ``art.key`` do not speak for this bucket of a release (None: they do).

    A result (validation, benchmark) names the manifest it judged and the store returns only results that
    judged the key's manifest now (:meth:`neuron_build.store.objects.JsonObjects.result`); an artifact rebuilt
    under its key (new weights from a recorded read, relinked) has other files than an older release pinned.
    So the results speak for the bucket only when that manifest lists exactly the files (names, sha256, sizes)
    the release pins; a missing manifest or an unreadable entry is not knowing, which is not a match."""
    man = store.manifest(art.key)
    if man is None:
        return "its artifact is not in the store"
    now = {n: {"sha256": f.sha256, "size": f.size} for n, f in man.files.items()}
    pinned = {n: {"sha256": f.get("sha256"), "size": f.get("size")} if isinstance(f, dict) else None
              for n, f in art.files.items()}
    if pinned == now:
        return None
    diff = sorted(n for n in set(now) | set(pinned) if now.get(n) != pinned.get(n))
    return f"the artifact under its key now has other files ({', '.join(diff)})"


# --------------------------------------------------------------------------------------------------
# channel pointers and history

def get_pointer(store: ArtifactStore, model: str, channel: str) -> ChannelPointer | None:
    """The pointer of a channel, or None when the channel has never held a release (or its pointer is
    unreadable).

    Raises:
        UntrustedRecord: the pointer names a release (or a previous one) that is not a plain name, e.g.
            ``../../x`` (release ids become paths: :mod:`neuron_build.trust`).
    """
    from neuron_build.trust import check_name

    ptr = ChannelPointer.from_json(store.channel(model, channel))
    if ptr is not None:
        for field_name, value in (("release", ptr.release), ("previous", ptr.previous)):
            if value is not None:
                check_name(value, field_name, f"channel pointer {model}/{channel}", store.location)
    return ptr


def get_history(store: ArtifactStore, model: str, channel: str) -> list[HistoryEntry]:
    """Every history entry of a channel, oldest first (unparsable lines and lines of another shape are
    skipped)."""
    entries = [e for e in map(HistoryEntry.from_json, store.history(model, channel)) if e is not None]
    # by the version each produced (a refusal after the version it was refused at), then as stored: two
    # hosts whose entries were written in another order than their swaps won still replay as one chain
    order = {id(e): i for i, e in enumerate(entries)}
    return sorted(entries, key=lambda e: (e.version if e.version is not None else -1,
                                          e.action not in ("promote", "rollback"), order[id(e)]))


def channel_pointer(store: ArtifactStore, model: str, channel: str) -> dict[str, Any] | None:
    """The pointer of a channel as JSON (``{"release", "version", "time", "who", ...}``), or None when the
    channel has never held a release."""
    ptr = get_pointer(store, model, channel)
    return ptr.to_json() if ptr else None


def channel_history(store: ArtifactStore, model: str, channel: str) -> list[dict[str, Any]]:
    """Every history line of a channel as JSON, oldest first (unparsable lines are skipped)."""
    return [e.to_json() for e in get_history(store, model, channel)]


# --------------------------------------------------------------------------------------------------
# releases read back


def find_release(store: ArtifactStore, model: str, rid: str) -> Release | None:
    """A release of ``model`` by its exact id, or None when the store holds none (or an unreadable one)."""
    return Release.from_json(store.release(model, rid))


def releases_of(store: ArtifactStore, model: str) -> list[Release]:
    """Every readable release of ``model``, oldest first (by created time)."""
    recs = [rel for _, rid, r in store.releases(model) if rid.startswith("r-")
            for rel in [Release.from_json(r)] if rel is not None]
    return sorted(recs, key=lambda r: r.created)


def list_releases(store: ArtifactStore, model: str) -> list[dict[str, Any]]:
    """Every release record of ``model`` as JSON, oldest first (by created time)."""
    return [r.to_json() for r in releases_of(store, model)]


def get_release(store: ArtifactStore, model: str, ref: str) -> Release:
    """A release of ``model`` by id or unique id prefix (``r-1a2b3c``, at least 6 hex digits).

    Raises:
        UserError: no such release, the prefix is ambiguous, or the release's record is unreadable.
        UntrustedRecord: ``ref`` (typed, or read from a pointer or a history entry) is not a plain name.
    """
    from neuron_build.trust import check_name

    check_name(ref, "release", f"release {ref!r} of {model!r}", store.location)  # before it becomes a path
    rel = find_release(store, model, ref)
    if rel is not None:
        return rel
    hits = store.release_ids(model, ref) if len(ref) >= 8 else []
    if len(hits) == 1:
        rel = find_release(store, model, hits[0])
        if rel is None:
            raise UserError(f"release {hits[0]} of model '{model}' in {store.location} is unreadable "
                            f"(not a release record)")
        return rel
    if len(hits) > 1:
        raise UserError(f"release prefix '{ref}' of model '{model}' is ambiguous: {', '.join(hits)}")
    known = [r.id for r in releases_of(store, model)][-5:]
    raise UserError(f"no release '{ref}' of model '{model}' in {store.location}; "
                    + (f"recent releases: {', '.join(known)}" if known else
                       f"make one with `neuron-build release {model}`"))


def load_release(store: ArtifactStore, model: str, ref: str) -> dict[str, Any]:
    """:func:`get_release` as JSON (the record as the store holds it).

    Raises:
        UserError: no such release, or the prefix is ambiguous.
    """
    return get_release(store, model, ref).to_json()


__all__ = [
    "ID_FIELDS",
    "RELEASE_FORMAT",
    "ChannelPointer",
    "HistoryEntry",
    "Release",
    "ReleaseArtifact",
    "actor",
    "channel_history",
    "channel_pointer",
    "find_release",
    "get_history",
    "get_pointer",
    "get_release",
    "git_state",
    "list_releases",
    "load_release",
    "release_id",
    "releases_of",
    "results_speak_for",
]
