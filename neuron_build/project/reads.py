"""What a model's factory reads at build time besides imports, recorded by the worker and keyed at the next
plan (the first level's last holes, the way recorded imports close the hole of a module loaded by a string).

Three kinds, recorded by :class:`ReadRecorder` in the worker while the factory runs:

- ``files``: project files it opens for reading (an audit hook on ``open``: ``open()``, ``io.open``,
  ``np.load``, ``torch.load`` all raise it; a file opened to write or append, a log, is not an input), as POSIX paths relative to the project folder; Python sources are left out
  (imports are recorded and keyed as sources), so are files of installed distributions, hidden folders,
  the store and the compile's own folders;
- ``env``: the environment variables read through ``os.environ`` / ``os.getenv`` by project code (the
  caller's frame is a project file: what torch or transformers read for themselves is not the factory's);
- ``dists``: the distributions whose modules building the model imported (the factory call, not the compile:
  a compile and a graph reuse record the same set)
  (``importlib.metadata.packages_distributions()`` over the new entries of ``sys.modules``), so a numpy
  upgrade changes the key without ``packages = [...]``; neuron-build itself is left out (the manifest
  records its version).

The key's ``model.reads`` component (:meth:`neuron_build.project.keys.KeyMaker.read_digests`) holds each
file's sha256, each variable's value (None when unset) and each distribution's version (None when gone).
No torch here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_build.project.sources import is_project_file

KINDS = ("files", "env", "dists")
#: Distributions never recorded: neuron-build itself (its version is in the manifest).
OWN = ("neuron-build", "neuron_build")
_HOOKED: list[ReadRecorder] = []  # the recorders listening (an audit hook cannot be removed)
_INSTALLED = False


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not _HOOKED:
        return
    path = args[0] if args else None
    mode = args[1] if len(args) > 1 else None
    flags = args[2] if len(args) > 2 else 0
    if isinstance(mode, str):
        reading = not any(c in mode for c in "wax+")
    else:  # os.open: no mode, the flags say it
        reading = isinstance(flags, int) and not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND)
    if reading and isinstance(path, (str, bytes, os.PathLike)):
        for r in _HOOKED:
            r._opened(path)


def empty() -> dict[str, list[str]]:
    """A reads record with nothing in it."""
    return {k: [] for k in KINDS}


def merge(*records: dict[str, Any] | None) -> dict[str, list[str]]:
    """The union of reads records (unknown kinds and non-string entries dropped), each list sorted."""
    out: dict[str, set[str]] = {k: set() for k in KINDS}
    for rec in records:
        if not isinstance(rec, dict):
            continue
        for k in KINDS:
            vals = rec.get(k)
            if isinstance(vals, list):
                out[k].update(v for v in vals if isinstance(v, str) and v)
    return {k: sorted(v) for k, v in out.items()}


class ReadRecorder:
    """Records the files a block opens and the environment variables project code reads in it.

    Args:
        root: the project folder (of ``buckets.toml``).
        exclude: folders whose files are never recorded (the compile's staging folder, the store).
    """

    def __init__(self, root: str | Path, exclude: Iterable[str | Path] = ()):
        self.root = Path(root).resolve()
        self.exclude = [Path(e).resolve() for e in exclude]
        self.files: set[str] = set()
        self.env: set[str] = set()
        self._orig: Any = None

    def _opened(self, path: Any) -> None:
        try:
            p = Path(os.fsdecode(path))
            if not p.is_absolute():
                p = Path.cwd() / p
            p = p.resolve()
        except (OSError, ValueError, TypeError):
            return
        if p.suffix in (".py", ".pyc") or not p.is_file():
            return
        if is_project_file(p, self.root, self.exclude):
            self.files.add(p.relative_to(self.root).as_posix())

    def _from_project(self) -> bool:
        """Is the code reading the environment a project file (the first frame outside ``os`` and the
        mapping machinery)?"""
        f = sys._getframe(2)
        skip = (os.__file__, getattr(sys.modules.get("_collections_abc"), "__file__", ""), __file__)
        while f is not None and (f.f_code.co_filename in skip or f.f_code.co_filename.startswith("<frozen ")):
            f = f.f_back
        if f is None:
            return False
        name = f.f_code.co_filename
        try:
            return is_project_file(Path(name).resolve(), self.root, self.exclude)
        except (OSError, ValueError):
            return False

    def __enter__(self) -> ReadRecorder:
        global _INSTALLED
        if not _INSTALLED:
            sys.addaudithook(_audit)
            _INSTALLED = True
        _HOOKED.append(self)
        cls = type(os.environ)
        self._orig = cls.__getitem__
        orig, me = self._orig, self

        def getitem(environ, key):  # os.environ[k], os.environ.get, os.getenv, `k in os.environ`
            if isinstance(key, str) and me._from_project():
                me.env.add(key)
            return orig(environ, key)

        cls.__getitem__ = getitem
        return self

    def __exit__(self, *exc: Any) -> None:
        type(os.environ).__getitem__ = self._orig
        if self in _HOOKED:
            _HOOKED.remove(self)

    def to_json(self, modules_before: Iterable[str] = ()) -> dict[str, list[str]]:
        """The record: ``files``, ``env`` and ``dists`` (of the modules imported since ``modules_before``,
        the names of ``sys.modules`` when the build began)."""
        return {"files": sorted(self.files), "env": sorted(self.env), "dists": imported_distributions(modules_before)}


def imported_distributions(modules_before: Iterable[str] = ()) -> list[str]:
    """The distributions (names as installed, sorted) providing the top-level modules imported since
    ``modules_before``; neuron-build itself left out."""
    import importlib.metadata as md

    before = {m.split(".")[0] for m in modules_before}
    tops = {m.split(".")[0] for m in list(sys.modules)} - before
    mapping = md.packages_distributions()
    dists = {d for t in tops for d in mapping.get(t, [])}
    return sorted(d for d in dists if d.replace("_", "-").lower() not in OWN)


def digests(root: Path, reads: dict[str, list[str]], environ: dict[str, str], digest: Any,
            observe: Any = None) -> dict[str, dict[str, Any]]:
    """The key's ``reads`` value: ``files`` (relative path -> sha256, or ``missing``), ``env`` (name ->
    value, None when unset), ``dists`` (name -> installed version, None when not installed).

    Args:
        digest: file -> sha256 (the key maker's digest cache).
        observe: an :class:`~neuron_build.project.plan_cache.InputLog` noting each file before it is read.
    """
    import importlib.metadata as md

    files = {}
    for rel in reads.get("files", []):
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            continue  # untrusted record: never a path outside the project
        f = root / rel
        if observe is not None:
            observe.file(f)
        files[rel] = digest(f) if f.is_file() else "missing"
    versions: dict[str, str | None] = {}
    for name in reads.get("dists", []):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {"files": files, "env": {n: environ.get(n) for n in reads.get("env", [])}, "dists": versions}


__all__ = ["KINDS", "ReadRecorder", "digests", "empty", "imported_distributions", "merge"]
