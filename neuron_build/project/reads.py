"""What a model's build reads besides its declared inputs, recorded by the worker and kept in the artifact's
manifest (``recorded_inputs``), checked at every lookup: ccache's direct mode, where the key holds the
declared inputs and a hit also needs every recorded input unchanged. Fail closed: what the recorder is
unsure of is recorded (an extra input costs a rebuild), what it cannot record makes the record
``incomplete`` (never a hit, rebuilt by every build, the reason in one line), nothing is dropped.

Four kinds, recorded by :class:`ReadRecorder` in the worker while the block runs:

- ``files``: files it opens for reading, whatever code opens them: an audit hook on ``open``
  (``open()``, ``io.open``, ``io.open_code``, ``np.load``, ``torch.load`` raise it); on Linux, inotify
  watches on the project's folders and on the folders its file symlinks point into
  (:class:`~neuron_build.project.native_reads.Watch`: safetensors' ``load_file`` and ``safe_open``,
  ``torch.from_file``, transformers' ``from_pretrained``; a read through a link is recorded under the
  link's name, so re-pointing the link changes the digest); and, as the block ends, the files mapped into
  the process (``/proc/self/maps``: a checkpoint memory-mapped from anywhere) or held open read-only
  (``/proc/self/fd``). A file first created or
  written in the block (an output, a log) is no input; one read before it was rewritten (even with the
  same bytes) is. Project files by POSIX path relative to the project folder; files outside it by
  absolute path, or ``~/...`` under the user's home, except the interpreter, installed distributions,
  system folders, the toolchain and tool caches (:data:`~neuron_build.project.outside.NOT_RECORDED_OUTSIDE`).
  A Python file read but not imported (``runpy.run_path``, ``exec(open(f).read())``) is a read; an
  imported one is not (imports are recorded as such: :func:`~neuron_build.project.sources.recorded_files`).
  Never recorded: folders that are never inputs (VCS, tools' caches, ``__pycache__``, ``*.egg-info``,
  ``*.dist-info``: :func:`never_read_folder`), the store and the compile's own folders. inotify sees every
  process's opens in the watched folders, so a file another process opens meanwhile may be recorded too:
  an extra input, never a missing one;
- ``listings``: folders whose entries were listed (``os.listdir``, ``os.scandir``, ``os.walk``,
  ``glob.glob``, ``Path.glob``, ``Path.iterdir``; not the import system's own listings), by the sorted
  names in them: a new shard a glob matches changes it;
- ``env``: the environment variables read by the block's own code (project code, or code imported from a
  folder outside the project and outside installed distributions), through ``os.environ``,
  ``os.getenv``, ``os.environb`` or ``os.getenvb`` (bytes names recorded decoded); what torch or
  transformers read for themselves is not the factory's;
- ``dists``: the distributions whose modules building the model imported (the factory call, not the
  compile: a compile and a graph reuse record the same set)
  (``importlib.metadata.packages_distributions()`` over the new entries of ``sys.modules``), so a numpy
  upgrade is noticed without ``packages = [...]``; neuron-build itself is left out (the manifest
  records its version).

What the block's own code does that no recorder can follow marks the record incomplete, naming it and
the fix (declare the inputs: model options ``inputs_from`` and ``env``, or ``always_rebuild``): a child
process (``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``: not torch's own
compiler processes) and a network connection (``socket.connect``, ``urllib``), as do an inotify that
cannot watch every folder or whose queue overflowed.

:class:`InputCheck` (:mod:`~neuron_build.project.read_check`, re-exported here) turns a record into digests (each file's sha256, ``missing`` unless a regular file,
each listing's names digest, each variable's value, None when unset, each distribution's version, None
when gone) and says which recorded input changed since. No torch here.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from neuron_build.project.native_reads import Watch as _Watch
from neuron_build.project.native_reads import file_mappings, mapped_files, open_files
from neuron_build.project.outside import INSTALLED_PARTS, exempt_folders, is_outside_name, outside_name
from neuron_build.project.read_check import InputCheck
from neuron_build.project.sources import is_project_file, never_input_folder

#: Audit events of a child process started (its reads cannot be recorded).
CHILD_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                          "os.forkpty", "pty.spawn", "os.startfile"})
#: Audit events of network access (what it fetches cannot be recorded).
NETWORK_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg", "urllib.Request"})
#: Top-level packages that only carry a caller's request (HTTP clients, process runners): a child process or
#: a connection they make is attributed to their caller.
TRANSPORT = frozenset({"requests", "urllib3", "httpx", "httpcore", "aiohttp", "botocore", "boto3", "s3transfer",
                       "fsspec", "s3fs", "gcsfs", "smart_open", "sh", "plumbum"})
#: Modules whose folder listings are the import system's, never a read: sys.path scans.
IMPORT_MACHINERY = ("importlib", "pkgutil", "pkg_resources", "site", "zipimport")
#: The fix an incomplete record's reason names.
FIX = "declare them with the model options inputs_from = [...] and env = [...], or always_rebuild = true"


def what(event: str, args: tuple) -> str:
    """What a child process runs or a connection reaches, short."""
    if event == "subprocess.Popen" and len(args) > 1:
        a = args[1]
        out = " ".join(map(os.fsdecode, a)) if isinstance(a, (list, tuple)) else os.fsdecode(a)
    elif event in ("os.system", "os.exec", "os.posix_spawn") and args:
        out = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else event
    elif event == "os.spawn" and len(args) > 1:
        out = os.fsdecode(args[1])
    elif event in ("socket.connect", "socket.sendto") and len(args) > 1:
        a = args[1]
        out = f"{a[0]}:{a[1]}" if isinstance(a, tuple) and len(a) >= 2 else str(a)
    elif event == "urllib.Request" and args:
        out = str(args[0])
    else:
        out = event
    return out if len(out) <= 60 else out[:57] + "..."


KINDS = ("files", "listings", "env", "dists")
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
_BUSY = threading.local()
_HERE = (__file__, sys.modules[_Watch.__module__].__file__)


def _audit(event: str, args: tuple) -> None:
    if not _HOOKED or getattr(_BUSY, "on", False):
        return
    _BUSY.on = True  # what the recorder itself does (resolve a path, read a variable) is no read
    try:
        _event(event, args)
    finally:
        _BUSY.on = False


def _event(event: str, args: tuple) -> None:
    if event == "open":
        path = args[0] if args else None
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        if isinstance(mode, str):  # r, r+, a+ read what the file held; w, w+, x, a do not
            reading = not any(c in mode for c in "wx") and ("r" in mode or "+" in mode)
        else:  # os.open: no mode, the flags say it (O_RDWR reads what the file held unless truncated)
            reading = isinstance(flags, int) and not flags & (os.O_WRONLY | os.O_TRUNC) \
                and not (flags & os.O_CREAT and flags & os.O_EXCL)
        if isinstance(path, (str, bytes, os.PathLike)):
            for r in _HOOKED:
                r._opened(path) if reading else r._wrote(path)
    elif event in ("os.listdir", "os.scandir"):
        for r in _HOOKED:
            r._listed(args[0] if args else None)
    elif event in CHILD_EVENTS or event in NETWORK_EVENTS:
        for r in _HOOKED:
            r._unrecordable(event, args)


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


@cache
def _stdlib() -> tuple[str, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if paths.get(k)}
    return tuple(d.rstrip(os.sep) + os.sep for d in dirs)


def _installed(path: Path) -> bool:
    """Is ``path`` (resolved) a module file of an installed distribution found on ``sys.path`` outside the
    usual folders (its top-level module named by ``importlib.metadata.packages_distributions()``, as
    :func:`~neuron_build.project.sources.recorded_files` counts them): library code, not the model's own."""
    import importlib.metadata as md

    global _INSTALLED_TOPS
    for entry in sys.path:
        try:
            base = Path(entry or ".").resolve()
        except (OSError, RuntimeError):
            continue
        if base != path and path.is_relative_to(base):
            top = path.relative_to(base).parts[0].removesuffix(".py")
            if _INSTALLED_TOPS is None:
                _INSTALLED_TOPS = frozenset(md.packages_distributions())
            if top in _INSTALLED_TOPS:
                return True
    return False


_INSTALLED_TOPS: frozenset[str] | None = None


class ReadRecorder:
    """Records the files and folders a block reads and the environment variables its own code reads, and
    marks the record incomplete when its own code starts a child process or opens a connection.

    Args:
        root: the project folder (of ``buckets.toml``).
        exclude: folders whose files are never recorded (the compile's staging folder, the store).
        native: watch with inotify and scan the process's mappings (else the audit hook alone).
    """

    def __init__(self, root: str | Path, exclude: Iterable[str | Path] = (), native: bool = True):
        self.root = Path(root).resolve()
        self.exclude = [Path(e).resolve() for e in exclude]
        self.files: set[str] = set()
        self.listings: set[str] = set()
        self.env: set[str] = set()
        #: why the record may be incomplete (inotify could not watch every folder, its queue overflowed, a
        #: child process or a connection of the block's own code); None when complete
        self.incomplete: str | None = None
        #: seconds the mappings scan took when the block ended
        self.scan_s = 0.0
        self._orig: Any = None
        self._native = native
        self._watch: _Watch | None = None
        self._maps_before: frozenset[tuple[bytes, bytes]] = frozenset()  # file mappings when the block started
        self._code: dict[str, Path] = {}  # Python files read: name -> resolved path (imported ones dropped)
        self._written: set[Path] = set()  # files outside the project the block wrote (its outputs)
        self._kinds: dict[str, str] = {}
        #: the folders inotify watched while the block ran (set when it ends)
        self.watched: list[Path] = []

    def _name(self, path: Path, real: Path, folder: bool = False) -> str | None:
        """The record's name of a file (or ``folder``) ``path`` (absolute, as named; ``real``: resolved):
        relative to the project when either lies in it (None when that place is never read), else its
        outside name (None for the places never recorded)."""
        inside = False
        for c in (path, real):
            if c.is_relative_to(self.root):
                inside = True
                if is_project_file(c / "_" if folder else c, self.root, self.exclude, never=never_read_folder):
                    return c.relative_to(self.root).as_posix()
        if inside or any(p.is_relative_to(e) for e in self.exclude for p in (path, real)):
            return None
        return outside_name(path) if outside_name(real) is not None else None

    def _opened(self, path: Any) -> None:
        try:
            p = Path(os.path.abspath(os.fsdecode(path)))  # as named: through a folder the project links to
            self._native_opened(p)
        except (OSError, ValueError, TypeError, RuntimeError):
            return

    def _wrote(self, path: Any) -> None:
        try:
            self._written.add(Path(os.path.abspath(os.fsdecode(path))).resolve())
        except (OSError, ValueError, TypeError, RuntimeError):
            return

    def _native_opened(self, path: Path) -> bool:
        """A file seen opened (by the audit hook, inotify or a mapping: any code, native included); True
        when it is recorded."""
        if path.suffix == ".pyc" or (not path.is_relative_to(self.root) and (
                str(path).startswith(exempt_folders()) or INSTALLED_PARTS.intersection(path.parts))):
            return False  # bytecode, an installed or the interpreter's file (most opens): no resolve
        try:
            real = path.resolve()
            if not real.is_file():
                return False
        except (OSError, RuntimeError):
            return False
        name = self._name(path, real)
        if name is None or (is_outside_name(name) and real in self._written):
            return False
        if path.suffix == ".py":
            self._code[name] = real  # decided when the block ends: an imported module is no read
        else:
            self.files.add(name)
        return True

    def _listed(self, path: Any) -> None:
        """A folder listed; recorded unless the import system listed it."""
        f = sys._getframe(2)
        while f is not None:
            code = f.f_code.co_filename
            mod = str(f.f_globals.get("__name__", "")).split(".")[0]
            if mod in IMPORT_MACHINERY or code.startswith(("<frozen importlib", "<frozen zipimport")):
                return
            f = f.f_back
        try:
            if isinstance(path, int):
                path = os.readlink(f"/proc/self/fd/{path}")
            p = Path(os.path.abspath(os.fsdecode(path if path is not None else ".")))
            name = self._name(p, p.resolve(), folder=True)
        except (OSError, ValueError, TypeError, RuntimeError):
            return
        if name is None:
            return
        self.listings.add(name or ".")

    def _kind(self, filename: str) -> str:
        """``own`` (project code, or code outside the project and installed distributions), ``std`` (the
        standard library, this module), ``pseudo`` (``<string>``: exec'd code) or ``lib``."""
        k = self._kinds.get(filename)
        if k is None:
            if filename.startswith("<"):
                k = "std" if filename.startswith("<frozen ") else "pseudo"
            elif filename in _HERE:
                k = "std"
            else:
                real = os.path.realpath(filename)
                if real.startswith(_stdlib()) and not INSTALLED_PARTS.intersection(Path(real).parts):
                    k = "std"
                elif self._name(Path(filename), Path(real)) is not None and (
                        Path(real).is_relative_to(self.root) or not _installed(Path(real))):
                    k = "own"
                else:
                    k = "lib"
            self._kinds[filename] = k
        return k

    def _from_project(self) -> bool:
        """Is the code reading the environment the block's own (the first frame outside ``os``, the mapping
        machinery and exec'd strings)?"""
        f = sys._getframe(2)
        skip = (os.__file__, getattr(sys.modules.get("_collections_abc"), "__file__", ""), *_HERE)
        while f is not None and (f.f_code.co_filename in skip or f.f_code.co_filename.startswith("<")):
            f = f.f_back
        return f is not None and self._kind(f.f_code.co_filename) == "own"

    def _unrecordable(self, event: str, args: tuple) -> None:
        """A child process or a connection: the record is incomplete when the block's own code made it
        (the first frame outside the standard library and :data:`TRANSPORT`), not torch's compilers."""
        if self.incomplete:
            return
        f = sys._getframe(2)
        while f is not None:
            k = self._kind(f.f_code.co_filename)
            if k == "own":
                break
            if k == "lib" and str(f.f_globals.get("__name__", "")).split(".")[0] not in TRANSPORT:
                return
            f = f.f_back
        if f is None:
            return
        if event in CHILD_EVENTS:
            self.incomplete = (f"project code ran a child process ({what(event, args)}) whose reads cannot "
                               f"be recorded: {FIX}")
        else:
            self.incomplete = (f"project code opened a connection ({what(event, args)}) whose data cannot be "
                               f"recorded: {FIX}")

    def __enter__(self) -> ReadRecorder:
        global _INSTALLED
        exempt_folders(), _stdlib()  # computed before the hook listens (they list /opt, read variables)
        if self._native:  # before the hook listens: its own walk lists every folder
            self._maps_before = file_mappings()  # what this process mapped before the block: not its reads
            self._watch = _Watch.start(self.root, self.exclude, never_read_folder)
            if self._watch is not None and self._watch.problem:
                self.incomplete = self._watch.problem
            elif self._watch is None and sys.platform.startswith("linux"):
                # fail closed: on Linux native reads are seen only through inotify; without it the record
                # may miss weights read by native code, so the artifact is never trusted as up to date
                self.incomplete = _Watch.unavailable or "inotify is not available"
        if not _INSTALLED:
            sys.addaudithook(_audit)
            _INSTALLED = True
        cls = type(os.environ)  # os.environb is another instance of the same class
        self._orig = cls.__getitem__
        orig, me = self._orig, self
        # torch.compiler.is_compiling when torch is loaded: TorchDynamo (torch.export, torch.compile) traces
        # through this function and cannot follow the frame walk; it folds this call to True, so a trace reads
        # the variable as before (its value enters the graph, which the graph key and the fresh gate see)
        torch = sys.modules.get("torch")
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)

        def getitem(environ, key):  # os.environ[k], .get, os.getenv, `k in os.environ`, os.environb, getenvb
            if compiling is not None and compiling():
                return orig(environ, key)
            if isinstance(key, (str, bytes)) and not getattr(_BUSY, "on", False):
                _BUSY.on = True
                try:
                    if me._from_project():
                        me.env.add(os.fsdecode(key))
                finally:
                    _BUSY.on = False
            return orig(environ, key)

        cls.__getitem__ = getitem
        _HOOKED.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        import time

        type(os.environ).__getitem__ = self._orig
        if self in _HOOKED:
            _HOOKED.remove(self)
        aliases: dict[Path, Path] = {}  # a folder the project links to (resolved) -> the project's name for it
        links: dict[Path, list[Path]] = {}  # a file a project symlink points to -> the links
        if self._watch is not None:
            self.watched = sorted(set(self._watch.dirs.values()))
            aliases = {d.resolve(): d for d in self.watched if d.is_relative_to(self.root)}
            links = self._watch.links
            opened, problem = self._watch.stop()
            self._watch = None
            self.incomplete = self.incomplete or problem
            for p in opened:
                self._seen(p, aliases, links)
        if self._native:
            t0 = time.perf_counter()
            skip = exempt_folders()
            for p in [*mapped_files(self._maps_before), *open_files()]:  # the toolchain's, the interpreter's: no resolve needed
                if not str(p).startswith(skip) and not INSTALLED_PARTS.intersection(p.parts):
                    self._seen(p, aliases, links)
            self.scan_s = time.perf_counter() - t0
        imported = set()
        for mod in list(sys.modules.values()):
            f = getattr(mod, "__file__", None)
            if isinstance(f, str) and f.endswith(".py"):
                imported.add(os.path.realpath(f))
        self.files.update(n for n, real in self._code.items() if str(real) not in imported)

    def _seen(self, p: Path, aliases: dict[Path, Path], links: dict[Path, list[Path]]) -> None:
        """A file natively read, named as the kernel names it (resolved, where a mapping lies): recorded by
        the project's names for it (the symlinks pointing to it, a linked folder's), else by its own."""
        try:
            real = p.resolve()
        except (OSError, RuntimeError):
            return
        named = links.get(real) or ([aliases[real.parent] / real.name] if real.parent in aliases else [])
        if real.is_relative_to(self.root) or not named:
            self._native_opened(p)  # its own name: a project file, or outside the project and named by none
        for n in named:
            self._native_opened(n)

    def to_json(self, modules_before: Iterable[str] = ()) -> dict[str, list[str]]:
        """The record: ``files``, ``listings``, ``env`` and ``dists`` (of the modules imported since
        ``modules_before``, the names of ``sys.modules`` when the build began), and ``incomplete``."""
        out: dict[str, Any] = {"files": sorted(self.files), "listings": sorted(self.listings),
                               "env": sorted(self.env), "dists": imported_distributions(modules_before)}
        if self.incomplete:
            out["incomplete"] = self.incomplete
        return out


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


__all__ = ["KINDS", "NEVER_READ_HIDDEN", "InputCheck", "ReadRecorder", "empty", "imported_distributions",
           "merge", "never_read_folder"]
