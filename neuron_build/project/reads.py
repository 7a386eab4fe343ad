"""What a model's factory reads at build time besides its declared inputs, recorded by the worker and kept
in the artifact's manifest (``recorded_inputs``), checked at every lookup: ccache's direct mode, where the key
holds the declared inputs and a hit also needs every recorded input unchanged.

Three kinds, recorded by :class:`ReadRecorder` in the worker while the factory runs:

- ``files``: project files it opens for reading, whatever code opens them: an audit hook on ``open``
  (``open()``, ``io.open``, ``np.load``, ``torch.load`` raise it) and, on Linux, inotify watches on the
  project's folders (``IN_OPEN``: safetensors' ``load_file`` and ``safe_open`` open and memory-map in Rust,
  ``torch.from_file`` in C++, transformers' ``from_pretrained`` through safetensors; inotify_simple, the
  kernel's inotify(7)); a file written, created or modified meanwhile (an output, a log) is not an input.
  As POSIX paths relative to the project folder; Python sources are left out (imports are recorded and
  checked as such), so are files of installed distributions, folders that are never inputs (hidden, VCS,
  ``__pycache__``, ``*.egg-info``, ``*.dist-info``: :func:`~neuron_build.project.sources.never_input_folder`),
  the store and the compile's own folders. inotify sees every process's opens in the watched folders, so a
  file another process opens while the factory runs may be recorded too: an extra input (a needless rebuild
  when it changes), never a missing one;
- ``env``: the environment variables read through ``os.environ`` / ``os.getenv`` by project code (the
  caller's frame is a project file: what torch or transformers read for themselves is not the factory's);
- ``dists``: the distributions whose modules building the model imported (the factory call, not the compile:
  a compile and a graph reuse record the same set)
  (``importlib.metadata.packages_distributions()`` over the new entries of ``sys.modules``), so a numpy
  upgrade is noticed without ``packages = [...]``; neuron-build itself is left out (the manifest
  records its version).

:class:`InputCheck` turns a record into digests (each file's sha256, each variable's value, None when unset,
each distribution's version, None when gone) and says which recorded input changed since. No torch here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_build.project.sources import is_project_file, never_input_folder

KINDS = ("files", "env", "dists")
#: Hidden folders whose files are never recorded reads: version control, tools' caches, the default state
#: folder. Any other hidden folder of the project (``.weights/``, ``.cache/``) may hold what a factory loads,
#: so its reads are recorded like any other folder's (fail closed: an extra input costs a rebuild, a missing
#: one serves a stale artifact).
NEVER_READ_HIDDEN = frozenset({".git", ".hg", ".svn", ".bzr", ".tox", ".nox", ".eggs", ".pytest_cache",
                               ".mypy_cache", ".ruff_cache", ".ipynb_checkpoints", ".idea", ".vscode",
                               ".neuron-build"})
#: Distributions never recorded: neuron-build itself (its version is in the manifest) and what the recorder
#: itself imports while the factory runs (inotify_simple, for the watches), which the model does not use.
OWN = ("neuron-build", "neuron_build", "inotify-simple")
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


def never_read_folder(name: str) -> bool:
    """Is a folder of this name never a place a recorded read comes from? :func:`never_input_folder`, except
    that of hidden folders only :data:`NEVER_READ_HIDDEN` are left out."""
    return name in NEVER_READ_HIDDEN if name.startswith(".") else never_input_folder(name)


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

    def __init__(self, root: str | Path, exclude: Iterable[str | Path] = (), native: bool = True):
        self.root = Path(root).resolve()
        self.exclude = [Path(e).resolve() for e in exclude]
        self.files: set[str] = set()
        self.env: set[str] = set()
        #: why the files read may be incomplete (inotify could not watch every folder, its queue
        #: overflowed); None when complete
        self.incomplete: str | None = None
        self._orig: Any = None
        self._native = native
        self._watch: _Watch | None = None
        #: the folders inotify watched while the block ran (set when it ends)
        self.watched: list[Path] = []

    def _opened(self, path: Any) -> None:
        try:
            p = Path(os.path.abspath(os.fsdecode(path)))  # as named: through a folder the project links to
            candidates = (p, p.resolve())
        except (OSError, ValueError, TypeError):
            return
        for c in candidates:
            if self._native_opened(c):
                return

    def _native_opened(self, path: Path) -> bool:
        """A file seen opened (by inotify: any code, native included); True when it is recorded."""
        if path.suffix in (".py", ".pyc") or not path.is_file():
            return False
        if is_project_file(path, self.root, self.exclude, never=never_read_folder):
            self.files.add(path.relative_to(self.root).as_posix())
            return True
        return False

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
        if self._native:
            self._watch = _Watch.start(self.root, self.exclude)
            if self._watch is not None and self._watch.problem:
                self.incomplete = self._watch.problem
            elif self._watch is None and sys.platform.startswith("linux"):
                # fail closed: on Linux native reads are seen only through inotify; without it the record
                # may miss weights read by native code, so the artifact is never trusted as up to date
                self.incomplete = _Watch.unavailable or "inotify is not available"
        return self

    def __exit__(self, *exc: Any) -> None:
        type(os.environ).__getitem__ = self._orig
        if self in _HOOKED:
            _HOOKED.remove(self)
        if self._watch is not None:
            self.watched = sorted(set(self._watch.dirs.values()))
            opened, problem = self._watch.stop()
            self._watch = None
            self.incomplete = self.incomplete or problem
            for p in opened:
                self._native_opened(p)

    def to_json(self, modules_before: Iterable[str] = ()) -> dict[str, list[str]]:
        """The record: ``files``, ``env`` and ``dists`` (of the modules imported since ``modules_before``,
        the names of ``sys.modules`` when the build began)."""
        out: dict[str, Any] = {"files": sorted(self.files), "env": sorted(self.env),
                               "dists": imported_distributions(modules_before)}
        if self.incomplete:
            out["incomplete"] = self.incomplete
        return out


class _Watch:
    """inotify watches (inotify_simple) on every folder under the project that may hold inputs, while a
    block runs: the files opened for reading in them, by any code of any process. Linux only; elsewhere
    (or without inotify_simple) :meth:`start` returns None and the audit hook alone records; on Linux the
    recorder then marks its record incomplete (:attr:`unavailable` says why), so it never counts as a hit."""

    #: Why inotify could not be started, once :meth:`start` returned None.
    unavailable: str | None = None

    def __init__(self, ino: Any, flags: Any, dirs: dict[int, Path], problem: str | None):
        self.ino, self.flags, self.dirs, self.problem = ino, flags, dirs, problem

    @classmethod
    def start(cls, root: Path, exclude: list[Path]) -> _Watch | None:
        try:
            from inotify_simple import INotify, flags
            ino = INotify()
        except ImportError:
            cls.unavailable = ("inotify_simple is not installed (a dependency of neuron-build: "
                               "pip install inotify_simple), so native reads could not be seen")
            return None
        except (OSError, AttributeError) as e:
            cls.unavailable = f"inotify could not be started ({e}), so native reads could not be seen"
            return None
        mask = flags.OPEN | flags.CLOSE_WRITE | flags.MODIFY | flags.CREATE | flags.MOVED_TO
        dirs: dict[int, Path] = {}
        problem = None
        seen = {root.resolve()}  # a folder reached twice (a link to a folder already watched, a link cycle)
        for dirpath, dirnames, _ in os.walk(root, followlinks=True):  # a linked checkpoint folder is watched
            here = Path(dirpath)
            keep = []
            for d in sorted(dirnames):
                if never_read_folder(d) or any((here / d).is_relative_to(e) for e in exclude) \
                        or (here / d / "pyvenv.cfg").is_file():  # a virtualenv (another than this one's)
                    continue
                try:
                    real = (here / d).resolve()
                except (OSError, RuntimeError):
                    continue
                if real in seen or any(real.is_relative_to(e) for e in exclude):
                    continue
                if is_project_file(here / d / "_", root, exclude, never=never_read_folder):
                    seen.add(real)
                    keep.append(d)
            dirnames[:] = keep
            try:
                dirs[ino.add_watch(dirpath, mask)] = here
            except OSError as e:  # ENOSPC: fs.inotify.max_user_watches reached
                problem = f"could not watch {dirpath} for native reads: {e.strerror or e}"
                break
        return cls(ino, flags, dirs, problem)

    def stop(self) -> tuple[list[Path], str | None]:
        """Stop watching; the files opened for reading meanwhile (not written, created or moved in), and
        why the record may be incomplete (the event queue overflowed), or None."""
        f = self.flags
        opened: set[Path] = set()
        written: set[Path] = set()
        problem = None
        try:
            while True:
                events = self.ino.read(timeout=0)
                if not events:
                    break
                for ev in events:
                    if ev.mask & f.Q_OVERFLOW:
                        problem = "the inotify event queue overflowed while the factory ran"
                        continue
                    base = self.dirs.get(ev.wd)
                    if base is None or not ev.name or ev.mask & f.ISDIR:
                        continue
                    p = base / ev.name
                    if ev.mask & (f.CLOSE_WRITE | f.MODIFY | f.CREATE | f.MOVED_TO):
                        written.add(p)
                    elif ev.mask & f.OPEN:
                        opened.add(p)
        finally:
            self.ino.close()
        return sorted(opened - written), problem


def imported_distributions(modules_before: Iterable[str] = ()) -> list[str]:
    """The distributions (names as installed, sorted) providing the top-level modules imported since
    ``modules_before``; neuron-build itself left out."""
    import importlib.metadata as md

    before = {m.split(".")[0] for m in modules_before}
    tops = {m.split(".")[0] for m in list(sys.modules)} - before
    if not tops:  # nothing imported since (the worker's compile block): no metadata scan (0.3 s)
        return []
    mapping = md.packages_distributions()
    dists = {d for t in tops for d in mapping.get(t, [])}
    return sorted(d for d in dists if d.replace("_", "-").lower() not in OWN)


#: The kinds of a manifest's ``recorded_inputs``, each with the word its change is reported with.
RECORDED = {"imports": "recorded import", "files": "recorded read", "env": "recorded variable",
            "dists": "recorded distribution"}


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
        self._dists: dict[str, str | None] = {}
        self._verdicts: dict[str, list[str]] = {}

    def file(self, rel: str) -> str:
        """sha256 of the project file ``rel`` (``missing`` when it is not a file, or not a safe relative
        path: an untrusted record never names a file outside the project)."""
        if rel not in self._files:
            p = Path(rel)
            if not rel or p.is_absolute() or ".." in p.parts:
                self._files[rel] = "missing"
            else:
                f = self.root / p
                try:
                    self._files[rel] = self.digest(f) if f.is_file() else "missing"
                except OSError:
                    self._files[rel] = "missing"
        return self._files[rel]

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
        """``names`` (``imports``, ``files``, ``env``, ``dists``: lists of names) with their digests now:
        file -> sha256 (or ``missing``), variable -> value (None when unset), distribution -> version."""
        return {"imports": {r: self.file(r) for r in names.get("imports", [])},
                "files": {r: self.file(r) for r in names.get("files", [])},
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
            for kind, word in RECORDED.items():
                entries = recorded.get(kind, {})
                now = self.current({kind: [n for n in entries if isinstance(n, str)]})[kind]
                out += [f"{word} {n} changed" for n in sorted(entries, key=str)
                        if not isinstance(n, str) or now.get(n) != entries[n]]
        self._verdicts[memo] = out
        return out


__all__ = ["KINDS", "RECORDED", "InputCheck", "ReadRecorder", "empty", "imported_distributions", "merge"]
