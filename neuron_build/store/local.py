"""The content-addressed artifact store (a local folder).

Layout (``shared/DESIGN.md``)::

    <store>/objects/<key[:2]>/<key>/     model.pt | model.pt2, model.neff, compile.log, worker.log, manifest.json
    <store>/targets/<target id>/last.json     the last key built for the target, with its key details
    <store>/targets/<target id>/failure.json  the last failed compile of the target (and failure.log)
    <store>/results/<key>/<kind>/<name>.json  validation and benchmark results of an artifact, per
                                         device kind: outside the immutable object, never in the key
    <store>/staging/                     artifacts being written (never read as objects)
    <store>/quarantine/<key>.<token>/    objects found corrupt or partial, with ``reason.txt`` (never served)
    <store>/locks/                       per-key compile locks and the host-memory ledger (locks.py)

An artifact is written into a staging folder, every file fsynced, its ``manifest.json`` last, and
published with one atomic ``rename``; a SIGKILL at any moment leaves the object complete or absent.
An object is complete when its manifest parses, matches its own digest, says PASS, and the folder holds
exactly the files it lists, each with the listed size (``check(key, deep=True)`` also compares every
sha256). Every lookup that finds an object that is not complete moves it to ``quarantine/``, so it is never
served and the next build compiles it again. A failed compile is recorded under its target, never under
``objects/``.
"""

from __future__ import annotations

import errno
import hashlib
import datetime as _dt
import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

from pydantic import ValidationError

from neuron_build.store.manifest import MANIFEST, Manifest

#: The manifest field holding the sha256 of the manifest's own canonical JSON (without this field).
SELF_DIGEST = "manifest_sha256"
#: errno values that mean the file system is full (ENOSPC) or the user's quota is used up (EDQUOT).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` that says the file system (or quota) is full."""
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (so a rename or a new entry in it survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_digest(raw: dict[str, Any]) -> str:
    """sha256 (64 hex chars) of a manifest's canonical JSON without its :data:`SELF_DIGEST` field."""
    body = {k: v for k, v in raw.items() if k != SELF_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def utc_now() -> str:
    """The current UTC time as ISO 8601 text to the second (``2026-11-29T11:12:33+00:00``), for the
    informational times of records; never part of a key."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file in the same folder, fsync and rename: readers see
    the old content or the new, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # e.g. ENOSPC: leave no temporary file behind
        raise


def read_json(path: Path) -> Any | None:
    """JSON content of ``path``, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class Store:
    """A local folder store.

    Args:
        root: the store folder; created on first write.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- objects -------------------------------------------------------------------------------
    def object_dir(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / key

    def manifest(self, key: str) -> Manifest | None:
        """The parsed manifest of a complete object, else None (missing, torn or failed; a torn object is
        quarantined by this lookup)."""
        raw = self._complete_manifest(key)
        return Manifest.model_validate(raw) if raw is not None else None

    def is_complete(self, key: str, deep: bool = False) -> bool:
        """True when the store holds a complete PASS artifact for ``key``.

        Cheap by default: one JSON read, one folder listing and one stat per file (sizes against the
        manifest); ``deep`` also compares the sha256 of every file. An object that is present but not
        complete is moved to ``quarantine/`` (see :meth:`check`) and False is returned: it is never
        served, and the next build compiles it again.
        """
        return self._complete_manifest(key, deep) is not None

    def check(self, key: str, deep: bool = False) -> str | None:
        """Why the object of ``key`` is not a complete artifact, or None when it is (or is absent).

        Read-only: nothing is moved. Reasons name the fault: an unreadable or invalid manifest, a manifest
        for another key, a non-PASS status, a missing, unlisted or wrongly sized file, or (``deep``) a
        sha256 that differs from the manifest's.
        """
        return self._inspect(key, deep)[1]

    def _complete_manifest(self, key: str, deep: bool = False) -> dict | None:
        raw, reason = self._inspect(key, deep)
        if reason is not None:
            self.quarantine(key, reason)
            return None
        return raw

    def _inspect(self, key: str, deep: bool) -> tuple[dict | None, str | None]:
        """(manifest, None) for a complete object, (None, None) for an absent one, (None, reason) else."""
        d = self.object_dir(key)
        try:
            text = (d / MANIFEST).read_bytes()
        except FileNotFoundError:
            if not d.exists():
                return None, None
            return None, "manifest.json is missing"
        except OSError as e:
            if not d.exists():
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
        if man.metrics.status != "PASS":
            return None, f"manifest status is {man.metrics.status}, not PASS"
        if not man.files:
            return None, "manifest.json lists no files"
        try:
            present = {p.relative_to(d).as_posix() for p in d.rglob("*") if not p.is_dir()}
        except OSError as e:
            return None, f"object folder is unreadable: {e.strerror or e}"
        present.discard(MANIFEST)
        for name in sorted(present - set(man.files)):
            return None, f"{name} is not listed in manifest.json"
        for name, ent in man.files.items():
            try:
                size = (d / name).stat().st_size
            except OSError:
                return None, f"{name} is missing"
            if size != ent.size:
                return None, f"{name} is {size} bytes, manifest.json says {ent.size}"
        if deep:
            from neuron_build.project.keys import file_sha256
            for name, ent in man.files.items():
                try:
                    digest = file_sha256(d / name)
                except OSError as e:
                    return None, f"{name} is unreadable: {e.strerror or e}"
                if digest != ent.sha256:
                    return None, f"{name} sha256 is {digest[:16]}..., manifest.json says {ent.sha256[:16]}..."
        return raw, None

    def object_keys(self) -> list[str]:
        """The names of every folder under ``objects/<prefix>/`` (complete or not), sorted."""
        base = self.root / "objects"
        if not base.is_dir():
            return []
        return sorted(d.name for sub in base.iterdir() if sub.is_dir() for d in sub.iterdir())

    def seal(self, obj: Path, manifest: Manifest) -> dict[str, Any]:
        """Finish a staging object: fsync every file, then write ``manifest.json`` last (with its own
        sha256 in :data:`SELF_DIGEST`), fsync it and the folder. The object is then ready to publish.

        Returns:
            The manifest as written (a dict).

        Raises:
            OSError: e.g. ENOSPC; the caller removes the staging folder.
        """
        for f in sorted(p for p in obj.rglob("*") if p.is_file()):
            fsync_path(f)
        raw = manifest.model_dump(mode="json")
        raw[SELF_DIGEST] = manifest_digest(raw)
        tmp = obj / f".{MANIFEST}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(raw, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, obj / MANIFEST)
        fsync_path(obj)
        return raw

    def staging_dir(self, key: str) -> Path:
        """A fresh, private folder to write an artifact into before :meth:`publish`."""
        d = self.root / "staging" / f"{key}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
        d.mkdir(parents=True)
        return d

    def publish(self, staging: Path, key: str) -> Path:
        """Move a fully written staging folder to ``objects/`` with one atomic rename.

        When a complete object already exists (another builder won), the staging folder is discarded.
        An incomplete object in the way is moved aside to ``quarantine/`` first.

        Returns:
            The object folder.
        """
        dest = self.object_dir(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            self.is_complete(key)  # quarantines an incomplete object in the way
        try:
            os.rename(staging, dest)
        except OSError:
            if not self.is_complete(key):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            return dest
        try:
            fsync_path(dest.parent)
        except OSError:
            pass
        return dest

    def quarantine(self, key: str, reason: str) -> Path | None:
        """Move an object out of ``objects/`` into ``quarantine/`` with a ``reason.txt``; None if absent."""
        return self.quarantine_path(self.object_dir(key), reason, key)

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

    def clean_staging(self) -> int:
        """Remove staging folders left by dead processes on this host. Returns how many were removed."""
        base = self.root / "staging"
        if not base.is_dir():
            return 0
        host = socket.gethostname()
        n = 0
        for d in base.iterdir():
            parts = d.name.split(".")
            if len(parts) < 4 or parts[-3] != host:
                continue
            try:
                pid = int(parts[-2])
            except ValueError:
                continue
            if pid != os.getpid() and not _alive(pid):
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n

    def iter_manifests(self) -> Iterator[Manifest]:
        """Every complete object's manifest."""
        base = self.root / "objects"
        if not base.is_dir():
            return
        for sub in sorted(base.iterdir()):
            for d in sorted(sub.iterdir()) if sub.is_dir() else []:
                m = self.manifest(d.name)
                if m is not None:
                    yield m

    # -- results beside an artifact ------------------------------------------------------------
    def record_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> Path:
        """Store a result about an artifact (``kind`` e.g. ``validation`` or ``bench``; ``name`` e.g. the
        device kind ``cpu`` or ``neuron``). Results never change the object or its key."""
        path = self.root / "results" / key / kind / f"{name}.json"
        write_json_atomic(path, result)
        return path

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        """A stored result, or None."""
        return read_json(self.root / "results" / key / kind / f"{name}.json")

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        """All results of one kind for an artifact: {name: result}."""
        base = self.root / "results" / key / kind
        if not base.is_dir():
            return {}
        return {p.stem: r for p in sorted(base.glob("*.json")) if (r := read_json(p)) is not None}

    # -- targets ------------------------------------------------------------------------------
    def target_dir(self, target_id: str) -> Path:
        return self.root / "targets" / target_id

    def record_target(self, target_id: str, record: dict[str, Any]) -> None:
        """Remember the last key built for a target (``key``, ``details``, ``status``, ``time``)."""
        write_json_atomic(self.target_dir(target_id) / "last.json", record)

    def target_record(self, target_id: str) -> dict[str, Any] | None:
        return read_json(self.target_dir(target_id) / "last.json")

    def target_records(self, model: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(target id, record) for every target of ``model`` the store has built."""
        base = self.root / "targets" / model
        if not base.is_dir():
            return
        for f in sorted(base.rglob("last.json")):
            rec = read_json(f)
            if rec:
                yield f.parent.relative_to(self.root / "targets").as_posix(), rec

    def record_failure(self, target_id: str, failure: dict[str, Any], log: bytes) -> None:
        """Record a failed compile: ``failure.json`` (status, reason, exit code, key) and ``failure.log``."""
        d = self.target_dir(target_id)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".failure.log.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            tmp.write_bytes(log)
            os.replace(tmp, d / "failure.log")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        write_json_atomic(d / "failure.json", failure)

    def failure(self, target_id: str) -> dict[str, Any] | None:
        """The last recorded failure of a target, or None."""
        return read_json(self.target_dir(target_id) / "failure.json")

    def clear_failure(self, target_id: str) -> None:
        for name in ("failure.json", "failure.log"):
            try:
                (self.target_dir(target_id) / name).unlink()
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
