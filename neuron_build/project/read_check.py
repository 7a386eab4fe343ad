"""The check of a manifest's ``recorded_inputs`` at lookup (:class:`InputCheck`): the current digest of every
recorded input (files by content, ``missing`` unless a regular file; folders by the names in them; variables
by value; distributions by version) and which of them changed. On the no-op path: cheap (the digest cache for
files, one ``os.listdir`` per recorded folder), no torch. Re-exported by :mod:`neuron_build.project.reads`,
whose :class:`~neuron_build.project.reads.ReadRecorder` makes the records."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from neuron_build.project.outside import is_outside_name, outside_path


def record_path(root: Path, name: str, home: str | None = None) -> Path | None:
    """The path a record's ``name`` stands for: relative to the project folder ``root`` (``.``: the folder),
    or outside it (``~/...`` under ``home``, default the user's; absolute); None for a name no record may
    hold (``..`` in it, an exempt place: an untrusted record never makes a check read a device, a kernel
    file or the toolchain)."""
    if is_outside_name(name):
        return outside_path(name, home)
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts:
        return None
    return root / p


#: The kinds of a manifest's ``recorded_inputs``, each with the word its change is reported with.
RECORDED = {"imports": "recorded import", "files": "recorded read", "listings": "recorded listing",
            "env": "recorded variable", "dists": "recorded distribution"}
#: Entries never in a listing's digest: what tools and the build itself add beside the inputs (names
#: starting so).
_NOT_LISTED = (".doit.db", "__pycache__", ".git", ".hg", ".svn", ".neuron-build", ".pytest_cache", ".mypy_cache",
               ".ruff_cache", ".ipynb_checkpoints")


class InputCheck:
    """The current digests of recorded inputs, and which of a manifest's recorded inputs changed.

    Args:
        root: the project folder (resolved).
        environ: the environment the build sees.
        digest: file -> sha256 (a :class:`~neuron_build.project.digest_cache.DigestCache`'s ``digest``:
            a file whose stat signature is unchanged is not read again).
    """

    def __init__(self, root: Path, environ: Any, digest: Any):
        self.root = root
        self.environ = environ
        self.digest = digest
        self._files: dict[str, str] = {}
        self._listings: dict[str, str] = {}
        self._dists: dict[str, str | None] = {}
        self._verdicts: dict[str, list[str]] = {}

    def _path(self, name: str) -> Path | None:
        """The path a record's ``name`` stands for: relative to the project, or outside it (``~/...``
        under this environment's home, absolute); None for a name no record may hold (``..``, an exempt
        place: an untrusted record never makes the check read a device, a kernel file or the toolchain)."""
        return record_path(self.root, name, self.environ.get("HOME") if hasattr(self.environ, "get") else None)

    def file(self, rel: str) -> str:
        """sha256 of the file a record names (``rel``: relative to the project, ``~/...`` or absolute);
        ``missing`` when it is not a regular file (a device, a fifo: never read) or no record may name it."""
        if rel not in self._files:
            f = self._path(rel)
            try:
                self._files[rel] = self.digest(f) if f is not None and stat.S_ISREG(os.stat(f).st_mode) \
                    else "missing"
            except OSError:
                self._files[rel] = "missing"
        return self._files[rel]

    def listing(self, name: str) -> str:
        """sha256 of the sorted entry names of the folder a record names (``.``: the project folder), tools'
        entries left out (``.git``, ``__pycache__``, ``.doit.db*``); ``missing`` when it is no folder."""
        if name not in self._listings:
            f = self._path(name)
            try:
                names = sorted(n for n in os.listdir(f) if not n.startswith(_NOT_LISTED)) \
                    if f is not None and f.is_dir() else None
            except OSError:
                names = None
            self._listings[name] = "missing" if names is None else \
                hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).hexdigest()
        return self._listings[name]

    def dist(self, name: str) -> str | None:
        """The installed version of distribution ``name`` (None when not installed)."""
        import importlib.metadata as md

        if name not in self._dists:
            try:
                self._dists[name] = md.version(name)
            except (md.PackageNotFoundError, ValueError):
                self._dists[name] = None
        return self._dists[name]

    def current(self, names: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
        """``names`` (``imports``, ``files``, ``listings``, ``env``, ``dists``: lists of names) with their
        digests now: file -> sha256 (or ``missing``), folder -> digest of its names (or ``missing``), variable -> value (None when unset), distribution -> version."""
        return {"imports": {r: self.file(r) for r in names.get("imports", [])},
                "files": {r: self.file(r) for r in names.get("files", [])},
                "listings": {r: self.listing(r) for r in names.get("listings", [])},
                "env": {n: self.environ.get(n) for n in names.get("env", [])},
                "dists": {n: self.dist(n) for n in names.get("dists", [])}}

    def stale(self, recorded: Any, memo: str | None = None) -> list[str]:
        """One line per recorded input of ``recorded`` (a manifest's ``recorded_inputs``, untrusted) that
        changed since, e.g. ``recorded read models/w.safetensors changed``; empty when all still match.
        None (nothing recorded) matches; a record that does not parse, or one marked ``incomplete``, never
        does (fail closed). ``memo``: a digest of ``recorded`` (equal records share one verdict)."""
        if recorded is None:
            return []
        if memo is None:
            import json
            try:
                memo = json.dumps(recorded, sort_keys=True)
            except (TypeError, ValueError):
                return ["its recorded inputs do not parse"]
        if memo in self._verdicts:
            return self._verdicts[memo]
        out: list[str] = []
        if not isinstance(recorded, dict) or not all(isinstance(recorded.get(k, {}), dict) for k in RECORDED):
            out.append("its recorded inputs do not parse")
        else:
            if recorded.get("incomplete"):
                out.append(f"its build's reads were not fully recorded ({recorded['incomplete']})")
            unknown = sorted(str(k) for k in recorded if k not in RECORDED and k != "incomplete")
            if unknown:  # a newer recorder's kind this version cannot check: fail closed
                out.append(f"its recorded inputs hold kinds this version cannot check ({', '.join(unknown)})")
            for kind, word in RECORDED.items():
                entries = recorded.get(kind, {})
                now = self.current({kind: [n for n in entries if isinstance(n, str)]})[kind]
                out += [f"{word} {n} changed" for n in sorted(entries, key=str)
                        if not isinstance(n, str) or now.get(n) != entries[n]]
        self._verdicts[memo] = out
        return out


__all__ = ["RECORDED", "InputCheck", "record_path"]
