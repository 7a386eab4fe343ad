"""The local folder store: the first implementation of :mod:`neuron_build.store.contract`.

Layout (``shared/DESIGN.md``); this module is its only owner::

    <store>/objects/<key[:2]>/<key>/     model.pt | model.pt2, model.neff, compile.log, worker.log, manifest.json
    <store>/targets/<target id>/last.json     the last key built for the target, with its key details
    <store>/targets/<target id>/failure.json  the last failed compile of the target (and failure.log)
    <store>/results/<key>/<kind>/<name>.json  validation and benchmark results of an artifact, per
                                         device kind: outside the immutable object, never in the key
    <store>/releases/<model>/<release id>.json        immutable release records
    <store>/channels/<model>/<channel>.json           a channel pointer: {"release", "version", ...}
    <store>/channels/<model>/<channel>.lock           held while a pointer is checked and swapped
    <store>/channels/<model>/<channel>.history.jsonl  one JSON line per promotion, refusal and rollback
    <store>/staging/                     artifacts being written (never read as objects)
    <store>/quarantine/<key>.<token>/    objects found corrupt or partial, with ``reason.txt`` (never served)
    <store>/locks/                       per-key compile locks and the host-memory ledger (locks.py)
    <store>/trash/                       objects gc is deleting (renamed here first)

An artifact is written into a staging folder, every file fsynced, its ``manifest.json`` last, and
published with one atomic ``rename``; a SIGKILL at any moment leaves the object complete or absent.
A failed compile is recorded under its target, never under ``objects/``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

from filelock import FileLock
from pydantic import ValidationError

from neuron_build.status import Status
from neuron_build.store.contract import Lookup
from neuron_build.store.manifest import MANIFEST, Manifest
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.util import (
    append_line,
    canonical_json,
    file_sha256,
    fsync_path,
    read_json,
    sha256_hex,
    write_atomic,
    write_json_atomic,
)

#: The manifest field holding the sha256 of the manifest's own canonical JSON (without this field).
SELF_DIGEST = "manifest_sha256"
_KEY = re.compile(r"^[0-9a-f]{64}$")


def manifest_digest(raw: dict[str, Any]) -> str:
    """sha256 (64 hex chars) of a manifest's canonical JSON without its :data:`SELF_DIGEST` field."""
    return sha256_hex(canonical_json({k: v for k, v in raw.items() if k != SELF_DIGEST}))


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` running on this host?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def inspect_object(folder: Path, key: str, deep: bool) -> tuple[Manifest | None, str | None]:
    """Check an artifact folder: (manifest, None) when complete, (None, None) when absent, (None, reason)
    when damaged. Reasons name the fault: an unreadable or invalid manifest, a manifest for another key, a
    non-PASS status, a missing, unlisted or wrongly sized file, or (``deep``) a differing sha256."""
    try:
        text = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        if not folder.exists():
            return None, None
        return None, "manifest.json is missing"
    except OSError as e:
        if not folder.exists():
            return None, None
        return None, f"manifest.json is unreadable: {e.strerror or e}"
    try:
        raw = json.loads(text)
    except ValueError as e:
        return None, f"manifest.json is not valid JSON ({e})"
    if not isinstance(raw, dict):
        return None, "manifest.json is not a JSON object"
    if SELF_DIGEST in raw and raw[SELF_DIGEST] != manifest_digest(raw):
        return None, "manifest.json does not match its own sha256 (edited or corrupt)"
    if raw.get("key") != key:
        return None, f"manifest.json names key {str(raw.get('key'))[:16]!r}, not this object's key"
    try:
        man = Manifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        return None, f"manifest.json is invalid: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    if man.metrics.status != Status.PASS:
        return None, f"manifest status is {man.metrics.status}, not PASS"
    if not man.files:
        return None, "manifest.json lists no files"
    try:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}
    except OSError as e:
        return None, f"object folder is unreadable: {e.strerror or e}"
    present.discard(MANIFEST)
    for name in sorted(present - set(man.files)):
        return None, f"{name} is not listed in manifest.json"
    for name, ent in man.files.items():
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return None, f"{name} is missing"
        if size != ent.size:
            return None, f"{name} is {size} bytes, manifest.json says {ent.size}"
    if deep:
        for name, ent in man.files.items():
            try:
                digest = file_sha256(folder / name)
            except OSError as e:
                return None, f"{name} is unreadable: {e.strerror or e}"
            if digest != ent.sha256:
                return None, f"{name} sha256 is {digest[:16]}..., manifest.json says {ent.sha256[:16]}..."
    return man, None


class LocalStore:
    """A store in a local folder (or a shared mount). Implements
    :class:`~neuron_build.store.contract.ArtifactStore`.

    Args:
        root: the store folder; created on first write.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.location = str(self.root)

    # -- paths: private to the store, public only for tests and the store's own upkeep ---------------
    def object_dir(self, key: str) -> Path:
        """The folder of ``key``'s object (``objects/<key[:2]>/<key>``)."""
        return self.root / "objects" / key[:2] / key

    def area(self, name: str) -> Path:
        """The folder of one area of the layout (``objects``, ``staging``, ``quarantine``, ...), for
        :mod:`neuron_build.store.maintenance`."""
        return self.root / name

    def _target_dir(self, target_id: str) -> Path:
        return self.root / "targets" / target_id

    def _result_path(self, key: str, kind: str, name: str) -> Path:
        return self.root / "results" / key / kind / f"{name}.json"

    def _release_path(self, model: str, release_id: str) -> Path:
        return self.root / "releases" / model / f"{release_id}.json"

    def _channel_path(self, model: str, channel: str, suffix: str = ".json") -> Path:
        return self.root / "channels" / model / f"{channel}{suffix}"

    def relative(self, path: Path | None) -> str | None:
        """``path`` relative to the store root, as POSIX text (None stays None)."""
        return path.relative_to(self.root).as_posix() if path is not None else None

    # -- action cache -------------------------------------------------------------------------------
    def lookup(self, key: str, deep: bool = False) -> Lookup:
        man, damage = inspect_object(self.object_dir(key), key, deep)
        return Lookup(key, man, damage)

    def repair(self, key: str, deep: bool = False) -> Lookup:
        found = self.lookup(key, deep)
        if found.damage is not None:
            self.quarantine(key, found.damage)
        return found

    def is_complete(self, key: str, deep: bool = False) -> bool:
        return inspect_object(self.object_dir(key), key, deep)[0] is not None

    def manifest(self, key: str) -> Manifest | None:
        return self.lookup(key).manifest

    def artifact_dir(self, key: str) -> Path:
        return self.object_dir(key)

    def keys(self) -> list[str]:
        base = self.root / "objects"
        if not base.is_dir():
            return []
        return sorted(d.name for sub in base.iterdir() if sub.is_dir() for d in sub.iterdir())

    def find_keys(self, prefix: str) -> list[str]:
        base = self.root / "objects" / prefix[:2]
        return sorted(p.name for p in base.glob(prefix + "*")) if base.is_dir() else []

    def manifests(self) -> Iterator[Manifest]:
        for key in self.keys():
            m = self.manifest(key)
            if m is not None:
                yield m

    def new_staging(self, key: str) -> Path:
        d = self.root / "staging" / f"{key}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        d.mkdir(parents=True)
        return d

    def seal(self, folder: Path, manifest: Manifest) -> dict[str, Any]:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            fsync_path(f)
        raw = manifest.model_dump(mode="json")
        raw[SELF_DIGEST] = manifest_digest(raw)
        write_atomic(folder / MANIFEST, (json.dumps(raw, indent=2) + "\n").encode())
        fsync_path(folder)
        return raw

    def publish(self, folder: Path, key: str) -> Path:
        dest = self.object_dir(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            self.repair(key)  # a damaged object in the way is quarantined
        try:
            os.rename(folder, dest)
        except OSError:
            if not self.is_complete(key):
                raise
            shutil.rmtree(folder, ignore_errors=True)
            return dest
        try:
            fsync_path(dest.parent)
        except OSError:
            pass
        return dest

    def quarantine(self, key: str, reason: str) -> str | None:
        return self.relative(self.quarantine_path(self.object_dir(key), reason, key))

    def quarantine_path(self, src: Path, reason: str, key: str | None = None) -> Path | None:
        """Move any entry under ``objects/`` (a torn object, a stray file) to ``quarantine/<name>.<token>``
        with one atomic rename, then write ``reason.txt`` beside its files (best effort on a full disk).

        Returns:
            The quarantine folder, or None when ``src`` was already gone (another process moved it).
        """
        if not os.path.lexists(src):
            return None
        dest = self.root / "quarantine" / f"{src.name}.{secrets.token_hex(4)}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not src.is_dir() or src.is_symlink():
            dest.mkdir()
            inner = dest / src.name
        else:
            inner = dest
        try:
            os.rename(src, inner)
        except FileNotFoundError:
            if inner is not dest:
                dest.rmdir()
            return None  # another process moved it first
        try:
            (dest / "reason.txt").write_text(reason + "\n")
        except OSError:
            pass  # e.g. a full disk: the object is out of objects/ all the same
        from neuron_build.log import get_logger
        get_logger(key=(key or src.name)[:12]).warning("object quarantined", reason=reason, moved_to=str(dest))
        return dest

    def staging_owner(self, folder: Path) -> tuple[str, int] | None:
        """(host, pid) of the builder that made a staging folder, from its name; None when not ours."""
        parts = folder.name.split(".")
        if len(parts) < 4 or not parts[-2].isdigit():
            return None
        return parts[-3], int(parts[-2])

    def clean_staging(self) -> int:
        base = self.root / "staging"
        if not base.is_dir():
            return 0
        host = socket.gethostname()
        n = 0
        for d in base.iterdir():
            owner = self.staging_owner(d)
            if owner is None or owner[0] != host:
                continue
            if owner[1] != os.getpid() and not pid_alive(owner[1]):
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n

    # -- records ----------------------------------------------------------------------------------
    def put_target(self, record: TargetRecord) -> None:
        write_json_atomic(self._target_dir(record.target) / "last.json", record.to_json())

    def target(self, target_id: str) -> TargetRecord | None:
        return TargetRecord.from_json(read_json(self._target_dir(target_id) / "last.json"))

    def _records(self, name: str, model: str | None, bucket_id: str | None) -> Iterator[tuple[str, Any]]:
        base = self.root / "targets"
        if model is not None:
            base = base / model
            if bucket_id is not None:
                base = base / bucket_id
        if not base.is_dir():
            return
        for f in sorted(base.rglob(name)):
            yield f.parent.relative_to(self.root / "targets").as_posix(), read_json(f)

    def targets(self, model: str, bucket_id: str | None = None) -> Iterator[TargetRecord]:
        for tid, raw in self._records("last.json", model, bucket_id):
            rec = TargetRecord.from_json(raw)
            if rec is not None:
                yield rec if rec.target == tid else replace(rec, target=tid)

    def all_targets(self) -> Iterator[TargetRecord]:
        for tid, raw in self._records("last.json", None, None):
            rec = TargetRecord.from_json(raw)
            if rec is not None:
                yield rec if rec.target == tid else replace(rec, target=tid)

    def put_failure(self, record: FailureRecord, log: bytes) -> None:
        d = self._target_dir(record.target)
        write_atomic(d / "failure.log", log)
        write_json_atomic(d / "failure.json", record.to_json())

    def failure(self, target_id: str) -> FailureRecord | None:
        return FailureRecord.from_json(read_json(self._target_dir(target_id) / "failure.json"))

    def failures(self, model: str, bucket_id: str | None = None) -> Iterator[FailureRecord]:
        for _, raw in self._records("failure.json", model, bucket_id):
            rec = FailureRecord.from_json(raw)
            if rec is not None:
                yield rec

    def failure_log(self, target_id: str) -> Path:
        return self._target_dir(target_id) / "failure.log"

    def clear_failure(self, target_id: str) -> None:
        for name in ("failure.json", "failure.log"):
            (self._target_dir(target_id) / name).unlink(missing_ok=True)

    def put_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> None:
        write_json_atomic(self._result_path(key, kind, name), result)

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        return read_json(self._result_path(key, kind, name))

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        base = self.root / "results" / key / kind
        if not base.is_dir():
            return {}
        return {p.stem: r for p in sorted(base.glob("*.json")) if (r := read_json(p)) is not None}

    # -- releases and channels ------------------------------------------------------------------------
    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        return write_json_atomic(self._release_path(model, release_id), record, create_only=True)

    def release(self, model: str, release_id: str) -> dict[str, Any] | None:
        return read_json(self._release_path(model, release_id))

    def release_ids(self, model: str, prefix: str = "") -> list[str]:
        d = self.root / "releases" / model
        return sorted(p.stem for p in d.glob(f"{prefix}*.json") if not p.name.startswith(".")) if d.is_dir() else []

    def releases(self, model: str | None = None) -> Iterator[tuple[str, str, Any]]:
        base = self.root / "releases"
        if not base.is_dir():
            return
        for d in sorted(base.iterdir()) if model is None else [base / model]:
            for p in sorted(d.glob("*.json")) if d.is_dir() else []:
                if not p.name.startswith("."):
                    yield d.name, p.stem, read_json(p)

    def channel(self, model: str, channel: str) -> dict[str, Any] | None:
        return read_json(self._channel_path(model, channel))

    def channels(self) -> Iterator[tuple[str, str, Any]]:
        base = self.root / "channels"
        for p in sorted(base.glob("*/*.json")) if base.is_dir() else []:
            if not p.name.startswith("."):
                yield p.parent.name, p.stem, read_json(p)

    def channel_lock(self, model: str, channel: str, timeout_s: float) -> AbstractContextManager[Any]:
        path = self._channel_path(model, channel, ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(str(path), timeout=timeout_s)

    def channel_lock_path(self, model: str, channel: str) -> Path:
        """The lock file of a channel (named in the message of a lock held too long)."""
        return self._channel_path(model, channel, ".lock")

    def set_channel(self, model: str, channel: str, pointer: dict[str, Any]) -> None:
        write_json_atomic(self._channel_path(model, channel), pointer)

    def append_history(self, model: str, channel: str, entry: dict[str, Any]) -> None:
        append_line(self._channel_path(model, channel, ".history.jsonl"),
                    json.dumps(entry, sort_keys=False, default=str))

    def history(self, model: str, channel: str) -> list[dict[str, Any]]:
        p = self._channel_path(model, channel, ".history.jsonl")
        if not p.is_file():
            return []
        out = []
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    # -- builders that share the store ----------------------------------------------------------------
    # -- ObjectIO (the minimum the Dask executor's store identity needs; issue 10 brings the full one) ----
    def _object_file(self, path: str) -> Path:
        """The file of the object at the relative POSIX ``path``.

        Raises:
            ValueError: ``path`` is absolute, empty or leaves the store (``..``).
        """
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"object path {path!r} is not a relative path inside the store")
        return self.root.joinpath(*parts)

    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        return write_atomic(self._object_file(path), data, create_only=create_only)

    def get_object(self, path: str) -> bytes | None:
        try:
            return self._object_file(path).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0):
        from neuron_build.store.locks import KeyLock
        return KeyLock(self.root, key, target=target, heartbeat_s=heartbeat_s)

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0):
        from neuron_build.store.locks import MemoryBudget
        return MemoryBudget(self.root, max_bytes, heartbeat_s=heartbeat_s)


def is_key(name: str) -> bool:
    """Is ``name`` an artifact key (64 lowercase hex chars)?"""
    return bool(_KEY.match(name))


__all__ = ["LocalStore", "SELF_DIGEST", "manifest_digest", "inspect_object", "pid_alive", "is_key"]
