"""Which source files a model's factory runs: the project-local modules it imports.

A leaf of the project layer: both the config check (every import resolves) and the key (every module's
source is hashed) use it, so neither imports the other.

Three ways a file gets into a model's sources:

1. **Static reading** (:func:`local_imports`): starting from the factory module, every ``import`` and
   ``from ... import`` (absolute, relative, ``from x import *``) that names a module whose file lies under
   the project folder (the folder of ``buckets.toml``), followed transitively, together with the package
   ``__init__.py`` of every package along each imported module's dotted path (importing ``a.b.c`` runs
   ``a/__init__.py`` and ``a/b/__init__.py`` first). A helper beside ``buckets.toml`` or a sibling package
   counts as much as a module under the models folder.
2. **Recorded imports** (:func:`recorded_files`): what no static reading sees (a module loaded by a string,
   ``importlib.import_module(name)``) is found by the worker, which lists the project-local files it actually
   imported during the build, and the modules it imported from a folder outside the project that no
   installed distribution provides (``sys.path.insert(0, "/some/lib")``: by absolute or ``~/`` name,
   :mod:`neuron_build.project.outside`); the next plan hashes that recorded set too (ccache's depend mode,
   DVC's recorded dependencies).
3. **``sources = [globs]``** in the model's table (:func:`glob_sources`): an escape hatch for files read in
   other ways (a config file the factory opens, a kernel source compiled at build time).

Never project sources: files of neuron-build itself, of an installed distribution (anything under a
``site-packages`` or ``dist-packages`` folder, or under the interpreter's prefix), package metadata
(``*.egg-info``, ``*.dist-info``), ``__pycache__``, and files in hidden folders (``.venv``, ``.git``,
``.hg``, ``.svn``, the state folder); :func:`never_input_folder`.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # neuron_build/


def is_project_file(path: Path, root: Path, exclude: Iterable[Path] = (), never: Any = None) -> bool:
    """Is ``path`` (absolute, resolved) a project source file under ``root``?

    False for files of neuron-build itself, of installed distributions (``site-packages``,
    ``dist-packages``, the interpreter's prefixes), in folders that are never inputs
    (:func:`never_input_folder`: hidden, VCS, ``__pycache__``, ``*.egg-info``, ``*.dist-info``; or the
    folder-name test ``never`` given instead), or under one of ``exclude`` (the store folder, for instance).
    """
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    if any((never or never_input_folder)(part) for part in rel.parts[:-1]):
        return False
    if any(path.is_relative_to(other) for other in (_PACKAGE_DIR, *exclude)):
        return False
    # an interpreter prefix inside the project (a venv folder not named with a dot) holds no project code
    return not any(path.is_relative_to(p) and not root.is_relative_to(p) for p in _prefixes())


#: Folders whose files are never inputs: installed packages, pip's and setuptools' metadata
#: (``*.egg-info``, ``*.dist-info``: written by ``pip install -e .``, absent from a fresh checkout),
#: bytecode caches and version-control folders (hidden ones, ``.git``, ``.hg``, ``.svn``, ``.bzr``, are
#: left out with every hidden folder).
NEVER_INPUT_DIRS = ("site-packages", "dist-packages", "__pycache__", "CVS", "_darcs")
NEVER_INPUT_SUFFIXES = (".egg-info", ".dist-info")


def never_input_folder(name: str) -> bool:
    """Is a folder of this name never an input (hidden, package metadata, bytecode, VCS, installed
    packages)? Files under it are neither sources nor recorded reads."""
    return name.startswith(".") or name in NEVER_INPUT_DIRS or name.endswith(NEVER_INPUT_SUFFIXES)


@cache
def _prefixes() -> tuple[Path, ...]:
    out = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        try:
            out.append(Path(p).resolve())
        except OSError:
            continue
    return tuple(out)


def _module_files(root: Path, parts: list[str], observe: Any = None) -> list[Path]:
    """The files importing the dotted module ``parts`` runs, when they exist under ``root``: each
    package's ``__init__.py`` along the path, and the module itself (``x.py`` or ``x/__init__.py``).
    ``observe`` (an :class:`~neuron_build.project.plan_cache.InputLog`) notes every path looked at."""
    out = []
    for n in range(1, len(parts) + 1):
        cand = root.joinpath(*parts[:n])
        init = cand / "__init__.py"
        if observe is not None:
            observe.file(init)
        if init.is_file():
            out.append(init)
            continue
        if n == len(parts):
            if observe is not None:
                observe.file(cand.with_suffix(".py"))
            if cand.with_suffix(".py").is_file():
                out.append(cand.with_suffix(".py"))
                continue
        if observe is not None:
            observe.folder(cand)
        if not cand.is_dir():
            break  # not a local package from here on (namespace packages are folders without __init__)
    return out


def _star_names(init: Path) -> list[str]:
    """The names in a literal ``__all__`` of a package's ``__init__.py`` (``from pkg import *`` imports
    those submodules)."""
    try:
        tree = ast.parse(init.read_bytes())
    except (SyntaxError, OSError):
        return []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                try:
                    names = ast.literal_eval(node.value)
                except ValueError:
                    return []
                return [n for n in names if isinstance(n, str)] if isinstance(names, (list, tuple)) else []
    return []


def module_path(root: Path, module: str, observe: Any = None) -> list[Path]:
    """The files importing the dotted ``module`` runs under ``root`` (package ``__init__`` files first)."""
    return _module_files(root, module.split("."), observe)


def local_imports(entry: Path, root: Path, exclude: Iterable[Path] = (), module: str | None = None,
                  observe: Any = None) -> list[Path]:
    """The project files that importing ``entry`` runs, directly or transitively (static, via ast).

    Args:
        entry: the factory module file.
        root: the project folder (the folder of ``buckets.toml``); imports resolve against it, as the worker
            puts it first on ``sys.path``.
        exclude: folders whose files never count (the store).
        module: ``entry``'s dotted module name (``models.minilm``); default: from its path under ``root``.
            The ``__init__.py`` of every package along it is included.
        observe: an :class:`~neuron_build.project.plan_cache.InputLog` that notes every file read and every
            path an import was looked up at, each before it is read (for the plan cache).

    Returns:
        Sorted paths, ``entry`` included.
    """
    root = root.resolve()
    entry = entry.resolve()
    exclude = [Path(e).resolve() for e in exclude]
    if module is None:
        rel = entry.relative_to(root).with_suffix("").parts
        module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
    seen: set[Path] = set()
    if observe is not None:
        observe.file(entry)
    todo = [*module_path(root, module, observe), entry]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file() or not is_project_file(f, root, exclude):
            continue
        seen.add(f)
        try:
            tree = ast.parse(f.read_bytes())
        except (SyntaxError, ValueError):
            continue
        pkg = list(f.relative_to(root).with_suffix("").parts)[:-1]  # the package this file is in (or is)
        for node in ast.walk(tree):
            mods: list[list[str]] = []
            if isinstance(node, ast.Import):
                mods = [a.name.split(".") for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    if node.level - 1 > len(pkg):
                        continue  # beyond the top-level package: Python refuses it too
                    base = pkg[: len(pkg) - (node.level - 1)]
                else:
                    base = []
                mod = base + (node.module.split(".") if node.module else [])
                if not mod:
                    continue
                mods = [mod]
                for a in node.names:
                    if a.name == "*":
                        init = root.joinpath(*mod, "__init__.py")
                        if observe is not None:
                            observe.file(init)
                        mods += [mod + [n] for n in _star_names(init)] if init.is_file() else []
                    else:
                        mods.append(mod + [a.name])  # a submodule, when one of that name exists
            for parts in mods:
                todo.extend(_module_files(root, parts, observe))
    return sorted(seen)


def glob_sources(root: Path, patterns: Iterable[str]) -> list[Path]:
    """The files under ``root`` matching the ``sources`` globs (``**`` recurses), sorted, folders left out.

    Patterns are relative to ``root`` (the folder of ``buckets.toml``)."""
    out: set[Path] = set()
    for pat in patterns:
        out.update(p for p in root.glob(pat) if p.is_file())
    return sorted(out)


def recorded_files(modules: Iterable[object], root: Path, exclude: Iterable[Path] = ()) -> list[str]:
    """The files among imported ``modules`` (``sys.modules.values()`` in the worker) that are the build's
    own code, sorted: project files, as POSIX paths relative to ``root``, and modules imported from a folder
    outside the project that belong to no installed distribution (``sys.path.insert(0, "/some/lib")`` in a
    factory), by their outside name (``~/...`` or absolute:
    :func:`~neuron_build.project.outside.outside_name`; the interpreter, installed distributions and the
    toolchain are never named). Built-in and frozen modules (no ``__file__``) and relative ``__file__``
    values are skipped; so is anything under ``exclude`` (the compile's staging folder)."""
    from neuron_build.project.outside import outside_name

    root = Path(root).resolve()
    exclude = [Path(e).resolve() for e in exclude]
    out = set()
    installed: set[str] | None = None
    for mod in list(modules):
        f = getattr(mod, "__file__", None)
        if not isinstance(f, str) or not f.endswith(".py") or not Path(f).is_absolute():
            continue  # a relative __file__ (some extension modules' helpers) names no file of ours
        try:
            p = Path(f).resolve()
        except OSError:
            continue
        if is_project_file(p, root, exclude):
            out.add(p.relative_to(root).as_posix())
            continue
        name = None if p.is_relative_to(root) else outside_name(p, exclude)
        if name is None:
            continue
        if installed is None:  # the top-level modules of installed distributions (their versions are recorded)
            import importlib.metadata as md
            installed = set(md.packages_distributions())
        if str(getattr(mod, "__name__", "")).split(".")[0] not in installed:
            out.add(name)
    return sorted(out)


__all__ = ["NEVER_INPUT_DIRS", "NEVER_INPUT_SUFFIXES", "glob_sources", "is_project_file", "never_input_folder", "local_imports", "module_path", "recorded_files"]
