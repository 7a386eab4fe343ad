"""Reads outside the project: which files outside the project folder a build's record names, and how.

A file the build reads outside the project (weights under ``~/ckpt``, a library folder put on ``sys.path``,
``/data/w.safetensors``) is a recorded input like a project file, named by its absolute path, or ``~/...``
when it lies under the user's home (two users' homes do not clash, a moved home does not move the name),
except the places in :data:`NOT_RECORDED_OUTSIDE`: the interpreter's own install, installed distributions,
system folders, the Neuron toolchain, known tool caches and kernel/device files. Those are what the toolchain
component and the ``dists`` record already stand for, or what no build's result depends on.

A leaf of the project layer (standard library only): the recorder (:mod:`neuron_build.project.reads`), the
imported-module list (:func:`neuron_build.project.sources.recorded_files`) and the key's filter of an
untrusted record (:meth:`neuron_build.project.keys.KeyMaker.recorded_inputs`) use it alike.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import NamedTuple


class Exempt(NamedTuple):
    """A kind of place outside the project whose files are never recorded reads."""

    #: what it is, as docs/key.md ("Reads outside the project") lists it
    what: str
    #: the folders (absolute, unresolved) it stands for on this host
    folders: Callable[[], list[str]]


def _home() -> str:
    return os.path.expanduser("~")


def _interpreter() -> list[str]:
    import sysconfig  # (lazy: the no-op's check imports this module and needs none of it)

    paths = sysconfig.get_paths()
    return [sys.prefix, sys.base_prefix, sys.exec_prefix,
            *(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib", "include"))]


def _tool_caches() -> list[str]:
    import getpass
    import tempfile

    home, tmp = _home(), tempfile.gettempdir()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    env = os.environ.get
    return [env("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tmp, f"torchinductor_{user}"),
            env("TRITON_CACHE_DIR") or os.path.join(home, ".triton"),
            env("TORCH_HOME") or os.path.join(env("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "torch"),
            os.path.join(home, ".cache", "torch_extensions"), os.path.join(home, ".nv"),
            env("NEURON_COMPILE_CACHE_URL") or "/var/tmp/neuron-compile-cache",
            os.path.join(tmp, "neuron-compile-cache")]


#: The places outside the project whose files are never recorded reads (each listed in docs/key.md, section
#: "Reads outside the project"). Besides these, any folder named ``site-packages`` or ``dist-packages``
#: (:data:`INSTALLED_PARTS`), neuron-build's own package, and the folders the worker is told never to read
#: (its compile folders, the store, the state folder) are left out.
NOT_RECORDED_OUTSIDE: tuple[Exempt, ...] = (
    Exempt("the interpreter's own install: sys.prefix, sys.base_prefix, sys.exec_prefix and the standard library",
           _interpreter),
    Exempt("installed distributions: any folder named site-packages or dist-packages", lambda: []),
    Exempt("system folders: /usr, /lib, /lib32, /lib64, /bin, /sbin", lambda: [
        "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin"]),
    Exempt("the Neuron toolchain: /opt/aws/neuron, /opt/aws_neuronx_venv_*", lambda: [
        "/opt/aws/neuron", *(str(p) for p in Path("/opt").glob("aws_neuronx_venv*"))]),
    Exempt("tool caches: Inductor's (TORCHINDUCTOR_CACHE_DIR, /tmp/torchinductor_USER), Triton's (~/.triton), "
           "torch's (~/.cache/torch, ~/.cache/torch_extensions), CUDA's (~/.nv), the Neuron compile cache "
           "(/var/tmp/neuron-compile-cache)", _tool_caches),
    Exempt("kernel and device files: /proc, /sys, /dev, /run", lambda: ["/proc", "/sys", "/dev", "/run"]),
)
#: Folder names whose files belong to an installed distribution.
INSTALLED_PARTS = frozenset({"site-packages", "dist-packages"})
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)  # neuron_build/


@cache
def exempt_folders() -> tuple[str, ...]:
    """The folders of :data:`NOT_RECORDED_OUTSIDE` on this host, resolved, each ending with a separator."""
    out = {_PACKAGE_DIR}
    for ex in NOT_RECORDED_OUTSIDE:
        for f in ex.folders():
            if f and os.path.isabs(f):
                out.add(f)
                out.add(os.path.realpath(f))
    return tuple(sorted({f.rstrip(os.sep) + os.sep for f in out if f.rstrip(os.sep)}))


def outside_name(path: str | Path, exclude: Iterable[str | Path] = ()) -> str | None:
    """The record's name of ``path`` (absolute, resolved), a file outside the project: ``~/...`` under the
    user's home, else the absolute path; None when it is never a recorded read (:data:`NOT_RECORDED_OUTSIDE`,
    an installed distribution's folder, under one of ``exclude``)."""
    p = os.fspath(path)
    if not os.path.isabs(p):
        return None
    if any(part in INSTALLED_PARTS for part in Path(p).parts):
        return None
    under = p.rstrip(os.sep) + os.sep  # a folder itself (a listing of /proc) as well as what is in it
    if any(under.startswith(f) for f in exempt_folders()):
        return None
    for e in exclude:
        e = os.fspath(e).rstrip(os.sep) + os.sep
        if under.startswith(e):
            return None
    home = _home().rstrip(os.sep) + os.sep
    if home != os.sep and p.startswith(home):
        return "~/" + p[len(home):]
    return p


def is_outside_name(name: str) -> bool:
    """Does a record's file ``name`` name a file outside the project (``~/...`` or absolute)?"""
    return name.startswith("~/") or name.startswith("/")


def outside_path(name: str, home: str | None = None) -> Path | None:
    """The file a record's outside ``name`` stands for here (``~/`` under ``home``, default the user's),
    or None when ``name`` is not a clean outside name (relative, ``..`` in it, or exempt: an untrusted
    record never makes the check read the toolchain, a device or a kernel file)."""
    if name.startswith("~/"):
        base = home or _home()
        if not os.path.isabs(base):
            return None
        p = os.path.join(base, name[2:])
    elif name.startswith("/"):
        p = name
    else:
        return None
    if ".." in Path(name).parts or os.path.normpath(p) != p.rstrip(os.sep) or outside_name(p) is None:
        return None
    return Path(p)


__all__ = ["INSTALLED_PARTS", "NOT_RECORDED_OUTSIDE", "Exempt", "exempt_folders", "is_outside_name",
           "outside_name", "outside_path"]
