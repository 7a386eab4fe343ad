"""The plan cache: the targets and keys of the last plan, reused while nothing the plan read has changed.

A no-op ``doit build`` spends most of its time before it checks a single target: importing the config
schema (pydantic), validating ``buckets.toml``, reading every model's sources and computing 1,000 keys.
The plan cache skips all of that when it can prove the keys would come out the same. While computing
keys, the :class:`~neuron_build.project.keys.KeyMaker` notes in an :class:`InputLog` every file-system
fact the keys depend on, each observed *before* it is read (stat, then read, as the digest cache does):

- every file it read (model sources, weight files, the weight files a package ships, recorded imports),
  and every path an import was looked up at that did not exist (``import helper`` probing
  ``helper/__init__.py`` and ``helper.py`` beside ``buckets.toml``), as ``[size, mtime_ns, ctime_ns,
  inode]`` or absent;
- every folder whose listing mattered (a weights folder and its subfolders), as its ``mtime_ns`` (adding
  or removing a file changes it);
- the ``sources`` globs with the files they matched (re-run on each check: a glob may match a new file
  anywhere below it).

:func:`write` saves that log with the config's sha256, the interpreter, ``sys.path`` and the
``mtime_ns`` of each of its folders (installing, upgrading or removing a package changes them: that covers
torch, the Neuron toolchain and every ``packages`` entry), the environment variables of the key's
allow-list and those the factories were recorded reading, the host's CPU ISA (:mod:`neuron_build.cpu_isa`), the
stat of every neuron-build module, and the targets with their keys (the declared inputs only: what builds
recorded besides lives in each artifact's manifest, checked by every task). :func:`load` returns them only if every one of those still matches; anything
else (or any doubt: an unreadable file, another format) is a miss, and the build plans as before.

A file changed within the same timestamp granule as the cache was written could keep its stat (git's
"racily clean" problem): an entry whose mtime or ctime is not older than the cache file makes the cache
unusable (it is deleted right after writing), so such a cache is never read. The cache is only an
accelerator: deleting ``<state_dir>/plan-cache.json`` is always safe.

No pydantic, torch or config import here: this runs on the no-op hot path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from neuron_build.cpu_isa import host_cpu_isa
from neuron_build.util import write_atomic

#: The file in the project's state folder.
PLAN_CACHE = "plan-cache.json"
FORMAT = 2
_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # neuron_build/


def file_sig(path: Path | str) -> list[int] | None:
    """``[size, mtime_ns, ctime_ns, inode]`` of a file (following symlinks); None when there is none (or it
    is a folder)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (st.st_mode & 0o170000) != 0o100000:  # not a regular file
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def dir_sig(path: Path | str) -> int | None:
    """``mtime_ns`` of a folder (changes when an entry is added, removed or renamed in it); None when there
    is no folder there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns if (st.st_mode & 0o170000) == 0o040000 else None


class InputLog:
    """The file-system facts a key computation read (see the module docstring). Observe before reading.

    Attributes:
        files: path -> :func:`file_sig` (None: looked for, not there).
        dirs: path -> :func:`dir_sig` of a folder whose entries were listed (None: not a folder).
        is_dir: path -> whether a folder was there when an import looked for one.
        globs: [root, patterns, matched files] per ``sources`` list.
    """

    def __init__(self) -> None:
        self.files: dict[str, list[int] | None] = {}
        self.dirs: dict[str, int | None] = {}
        self.is_dir: dict[str, bool] = {}
        self.globs: list[list[Any]] = []

    def file(self, path: Path | str) -> None:
        """Note a file about to be read or looked for (its first observation counts)."""
        p = str(path)
        if p not in self.files:
            self.files[p] = file_sig(p)

    def listing(self, path: Path | str) -> None:
        """Note a folder about to be listed."""
        p = str(path)
        if p not in self.dirs:
            self.dirs[p] = dir_sig(p)

    def folder(self, path: Path | str) -> None:
        """Note a path checked for being a folder."""
        p = str(path)
        if p not in self.is_dir:
            self.is_dir[p] = os.path.isdir(p)

    def glob(self, root: Path, patterns: list[str] | tuple[str, ...], matches: list[Path]) -> None:
        """Note a ``sources`` glob list and what it matched (re-run on every check)."""
        self.globs.append([str(root), list(patterns), sorted(str(m) for m in matches)])

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "dirs": self.dirs, "is_dir": self.is_dir, "globs": self.globs}


def config_digest(data: bytes) -> str:
    """sha256 (hex) of a config file's bytes."""
    return hashlib.sha256(data).hexdigest()


def interpreter() -> dict[str, Any]:
    """The interpreter and where it finds packages: ``sys.path`` with each folder's ``mtime_ns``."""
    return {"executable": sys.executable, "version": sys.version,
            "path": [[p, dir_sig(p) if p else None] for p in sys.path]}


def _code() -> dict[str, list[int]]:
    """``[size, mtime_ns]`` of every module of neuron-build itself (the code that computes keys)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(_PACKAGE_DIR):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in filenames:
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out[p] = [st.st_size, st.st_mtime_ns]
    return out


def write(state_dir: Path, *, config_path: Path, config_sha256: str, log: InputLog, env_names: list[str],
          store: str, backend: str, hardware_target: str, targets: list[tuple[str, str]],
          interp: dict[str, Any] | None = None) -> bool:
    """Save the plan cache of one plan. Returns whether a usable cache was written (False: the folder is
    not writable, or an input changed within the cache file's timestamp granule; a stale file is removed).

    Args:
        state_dir: the project's state folder (``[build] state_dir``).
        config_path: the resolved ``buckets.toml``; ``config_sha256`` the sha256 of the bytes parsed.
        log: what the key computation read.
        env_names: the environment variables in the key (all backends' allow-lists).
        store: the local store folder (absolute).
        backend, hardware_target: as resolved for the plan.
        targets: (target id, key) of every target, in matrix order.
        interp: :func:`interpreter` as it was when planning began (default: now); planning may add to
            ``sys.path`` (a factory's import), a later no-op checks the path it starts with.
    """
    doc = {
        "format": FORMAT, "config": str(config_path), "config_sha256": config_sha256,
        "interpreter": interp or interpreter(), "code": _code(),
        "env": {n: os.environ.get(n) for n in sorted(set(env_names))},
        "inputs": log.to_json(), "store": store, "backend": backend,
        "hardware_target": hardware_target, "targets": targets, "cpu_isa": host_cpu_isa(),
    }
    path = state_dir / PLAN_CACHE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(doc, separators=(",", ":")).encode())
        written = os.stat(path).st_mtime_ns
    except OSError:
        return False
    stamps = [s[1] for s in log.files.values() if s] + [s[2] for s in log.files.values() if s]
    stamps += [s for s in log.dirs.values() if s] + [s[1] for s in doc["code"].values()]
    if stamps and max(stamps) >= written:  # racily clean: a later edit could keep this stat
        try:
            path.unlink()
        except OSError:
            pass
        return False
    return True


class Plan:
    """A plan read back from the cache: what a no-op build needs, nothing else.

    Attributes:
        store: the local store folder; backend, hardware_target: as planned; targets: (target id, key)
        in matrix order; root: the project folder; state_dir: the project's state folder.
    """

    def __init__(self, doc: dict[str, Any], state_dir: Path | str = "."):
        self.store: str = doc["store"]
        self.backend: str = doc["backend"]
        self.hardware_target: str = doc["hardware_target"]
        self.targets: list[tuple[str, str]] = [(t, k) for t, k in doc["targets"]]
        self.root = str(Path(doc["config"]).parent)
        self.state_dir = str(state_dir)

    def keys(self) -> dict[str, str]:
        """target id -> key."""
        return dict(self.targets)


def load(state_dir: Path, config_path: Path, config_bytes: bytes) -> tuple[Plan | None, str]:
    """The cached plan if every input it was computed from is unchanged, else (None, why not)."""
    try:
        doc = json.loads((state_dir / PLAN_CACHE).read_bytes())
    except (OSError, ValueError):
        return None, "no plan cache"
    try:
        if doc.get("format") != FORMAT:
            return None, "another format"
        if doc["config"] != str(config_path) or doc["config_sha256"] != config_digest(config_bytes):
            return None, "the config changed"
        if doc["interpreter"] != interpreter():
            return None, "the interpreter or its packages changed"
        if doc["env"] != {n: os.environ.get(n) for n in doc["env"]}:
            return None, "a key environment variable changed"
        if doc.get("cpu_isa") != host_cpu_isa():  # in the key of AOTInductor CPU targets
            return None, "the host's CPU ISA changed"
        if doc["code"] != _code():
            return None, "neuron-build changed"
        inputs = doc["inputs"]
        for p, sig in inputs["files"].items():
            if file_sig(p) != sig:
                return None, f"{p} changed"
        for p, sig in inputs["dirs"].items():
            if dir_sig(p) != sig:
                return None, f"folder {p} changed"
        for p, was in inputs["is_dir"].items():
            if os.path.isdir(p) != was:
                return None, f"{p} appeared or went"
        if inputs["globs"]:
            from neuron_build.project.sources import glob_sources
            for root, patterns, matches in inputs["globs"]:
                if sorted(str(m) for m in glob_sources(Path(root), patterns)) != matches:
                    return None, "a sources glob matches other files"
        return Plan(doc, state_dir), "hit"
    except (KeyError, TypeError, ValueError, AttributeError):
        return None, "unreadable plan cache"


__all__ = ["PLAN_CACHE", "InputLog", "Plan", "dir_sig", "file_sig", "interpreter", "load", "write"]
