"""The content-addressed artifact store (a local folder).

Layout (``shared/DESIGN.md``)::

    <store>/objects/<key[:2]>/<key>/     model.pt | model.pt2, model.neff, compile.log, worker.log, manifest.json
    <store>/targets/<target id>/last.json     the last key built for the target, with its key details
    <store>/targets/<target id>/failure.json  the last failed compile of the target (and failure.log)
    <store>/results/<key>/<kind>/<name>.json  validation and benchmark results of an artifact, per
                                         device kind: outside the immutable object, never in the key
    <store>/staging/                     artifacts being written (never read as objects)

An artifact is written into a staging folder, its ``manifest.json`` last, and published with one atomic
``rename``; an object is complete when its manifest parses, says PASS, and every file it lists exists with
the listed size. A failed compile is recorded under its target, never under ``objects/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Any, Iterator

from .manifest import MANIFEST, Manifest


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file in the same folder, fsync and rename: readers see
    the old content or the new, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
        """The parsed manifest of a complete object, else None (missing, torn or failed)."""
        raw = self._complete_manifest(key)
        return Manifest.model_validate(raw) if raw is not None else None

    def is_complete(self, key: str) -> bool:
        """True when the store holds a complete PASS artifact for ``key``: the manifest parses and every
        listed file exists with its listed size. Cheap: one JSON read and one stat per file."""
        return self._complete_manifest(key) is not None

    def _complete_manifest(self, key: str) -> dict | None:
        d = self.object_dir(key)
        raw = read_json(d / MANIFEST)
        if not isinstance(raw, dict) or raw.get("key") != key:
            return None
        if raw.get("metrics", {}).get("status") != "PASS":
            return None
        for name, ent in raw.get("files", {}).items():
            try:
                if (d / name).stat().st_size != ent["size"]:
                    return None
            except (OSError, KeyError, TypeError):
                return None
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
        if dest.exists() and not self.is_complete(key):
            self.quarantine(key, "incomplete object found at publish")
        try:
            os.rename(staging, dest)
        except OSError:
            if not self.is_complete(key):
                raise
            shutil.rmtree(staging, ignore_errors=True)
        return dest

    def quarantine(self, key: str, reason: str) -> Path | None:
        """Move an object out of ``objects/`` into ``quarantine/`` with a ``reason.txt``; None if absent."""
        src = self.object_dir(key)
        if not src.exists():
            return None
        dest = self.root / "quarantine" / f"{key}.{secrets.token_hex(4)}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(src, dest)
        except FileNotFoundError:
            return None
        (dest / "reason.txt").write_text(reason + "\n")
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
        tmp = d / f".failure.log.{os.getpid()}.tmp"
        tmp.write_bytes(log)
        os.replace(tmp, d / "failure.log")
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
