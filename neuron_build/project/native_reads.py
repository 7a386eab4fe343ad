"""What native code reads, seen from outside the interpreter: inotify watches on the project's folders
(:class:`Watch`), the file-backed memory mappings of the process (:func:`mapped_files`) and the files it
holds open (:func:`open_files`).

Used by :class:`neuron_build.project.reads.ReadRecorder`; standard library and inotify_simple only.

- :class:`Watch`: every folder under the project that may hold inputs (and, for each file symlink under
  the project, the folder its target lies in: the kernel reports an open on the target's folder, not the
  link's) is watched for ``IN_OPEN``, the write events and ``IN_CLOSE_NOWRITE`` while the block runs. A
  file counts as read when it was opened and closed read-only before it was first written, created or
  moved in (a factory that reads a file, then rewrites it with the same bytes, still read it: a later
  real change must be noticed), or opened and never written at all; a file first created or written
  meanwhile is an output. A read of a link's target is recorded under the link's name (by the recorder).
- :func:`mapped_files`: the regular files mapped into this process (``/proc/self/maps``) when the block
  ends: what safetensors' ``load_file`` and ``safe_open`` (and ``torch.load(mmap=True)``, numpy's memmap)
  left mapped, wherever it lies (a checkpoint under the user's home is in no watched folder), and
  :func:`open_files`: the regular files it holds open read-only then (a handle native code keeps).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from neuron_build.project.sources import is_project_file


class Watch:
    """inotify watches (inotify_simple) on every folder under the project that may hold inputs, while a
    block runs: the files opened for reading in them, by any code of any process. Linux only; elsewhere
    (or without inotify_simple) :meth:`start` returns None and the audit hook alone records; on Linux the
    recorder then marks its record incomplete (:attr:`unavailable` says why), so it never counts as a hit."""

    #: Why inotify could not be started, once :meth:`start` returned None.
    unavailable: str | None = None

    def __init__(self, ino: Any, flags: Any, dirs: dict[int, Path], problem: str | None,
                 links: dict[Path, list[Path]] | None = None):
        self.ino, self.flags, self.dirs, self.problem = ino, flags, dirs, problem
        #: a file symlink's target (resolved) -> the link paths under the project that point to it
        self.links = links or {}

    @classmethod
    def start(cls, root: Path, exclude: list[Path], never: Any) -> Watch | None:
        """Watch ``root``'s folders (``never``: the folder-name test of folders never read), the folders
        its file symlinks point into, none under ``exclude``."""
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
        mask = flags.OPEN | flags.CLOSE_NOWRITE | flags.CLOSE_WRITE | flags.MODIFY | flags.CREATE | flags.MOVED_TO
        dirs: dict[int, Path] = {}
        problem = None
        links: dict[Path, list[Path]] = {}
        seen = {root.resolve()}  # a folder reached twice (a link to a folder already watched, a link cycle)
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):  # a linked folder is watched
            here = Path(dirpath)
            keep = []
            for d in sorted(dirnames):
                if never(d) or any((here / d).is_relative_to(e) for e in exclude) \
                        or (here / d / "pyvenv.cfg").is_file():  # a virtualenv (another than this one's)
                    continue
                try:
                    real = (here / d).resolve()
                except (OSError, RuntimeError):
                    continue
                if real in seen or any(real.is_relative_to(e) for e in exclude):
                    continue
                if is_project_file(here / d / "_", root, exclude, never=never):
                    seen.add(real)
                    keep.append(d)
            dirnames[:] = keep
            for name in filenames:
                if os.path.islink(here / name):
                    try:
                        target = (here / name).resolve(strict=True)
                    except (OSError, RuntimeError):
                        continue
                    links.setdefault(target, []).append(here / name)
            try:
                dirs[ino.add_watch(dirpath, mask)] = here
            except OSError as e:  # ENOSPC: fs.inotify.max_user_watches reached
                problem = f"could not watch {dirpath} for native reads: {e.strerror or e}"
                break
        for folder in sorted({t.parent for t in links} - seen) if problem is None else []:
            try:  # the folder a link points into: the kernel reports the target's open there
                dirs[ino.add_watch(str(folder), mask)] = folder
            except OSError as e:
                problem = f"could not watch {folder} (a link's target folder) for native reads: {e.strerror or e}"
                break
        return cls(ino, flags, dirs, problem, links)

    def stop(self) -> tuple[list[Path], str | None]:
        """Stop watching; the files read meanwhile (opened, and closed read-only before they were first
        written, created or moved in, or never written at all; a link's target as the kernel names it: the
        recorder names it by :attr:`links`), and why
        the record may be incomplete (the event queue overflowed), or None."""
        f = self.flags
        opened: set[Path] = set()
        read_first: set[Path] = set()  # closed read-only before any write
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
                    elif ev.mask & f.CLOSE_NOWRITE:
                        if p not in written:
                            read_first.add(p)
                    elif ev.mask & f.OPEN:
                        opened.add(p)
        finally:
            self.ino.close()
        return sorted((opened - written) | (read_first & opened)), problem


def file_mappings() -> frozenset[tuple[bytes, bytes]]:
    """The file-backed mappings of this process now, each as ``(address range, path)`` (``/proc/self/maps``;
    deleted files left out); empty where there is no ``/proc``. A recorder takes them when its block starts:
    a mapping still there, at the same addresses, when the block ends was made before it (an earlier
    release loaded by this process), not read by the block; a file the block maps again gets new addresses."""
    try:
        with open("/proc/self/maps", "rb") as fh:
            raw = fh.read()
    except OSError:
        return frozenset()
    out = set()
    for line in raw.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith(b"/") and not parts[5].endswith(b" (deleted)"):
            out.add((parts[0], parts[5]))
    return frozenset(out)


def mapped_files(before: frozenset[tuple[bytes, bytes]] = frozenset()) -> list[Path]:
    """The regular files mapped into this process now (``/proc/self/maps``: file-backed mappings, deleted
    files left out), less the mappings in ``before`` (:func:`file_mappings` when the block started); empty
    where there is no ``/proc``."""
    paths = {path for rng, path in file_mappings() - before}
    return [Path(os.fsdecode(p)) for p in sorted(paths)]


def open_files() -> list[Path]:
    """The regular files this process holds open read-only now (``/proc/self/fd`` and the access mode in
    ``/proc/self/fdinfo``: a handle native code keeps, wherever the file lies); empty where there is no
    ``/proc``. A file open for writing (a log) is an output, never listed."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    out = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if not target.startswith("/") or target.endswith(" (deleted)"):
                continue
            with open(f"/proc/self/fdinfo/{fd}", "rb") as fh:
                flags = next((int(line.split()[1], 8) for line in fh if line.startswith(b"flags:")), None)
        except (OSError, ValueError, IndexError):
            continue
        if flags is not None and flags & os.O_ACCMODE == os.O_RDONLY:
            out.add(target)
    return [Path(p) for p in sorted(out)]


__all__ = ["Watch", "file_mappings", "mapped_files", "open_files"]
