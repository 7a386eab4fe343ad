"""Every exception class the package defines derives from the one root, :class:`NeuronBuildError`
(``neuron_build/errors.py``), so that a command maps any of them to its exit status."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

from neuron_build.errors import ExitCode, NeuronBuildError, exit_code
from tests.helpers.cli import REPO

PKG = REPO / "neuron_build"

#: Exception classes outside the root: none (a new one derives from NeuronBuildError, keeping a builtin base
#: its callers catch, e.g. ``(ValueError, NeuronBuildError)``).
OUTSIDE_ROOT: set[str] = set()


def modules() -> dict[str, Path]:
    """The package's modules by dotted name (``__main__`` left out: importing it runs the command line)."""
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if p.name != "__main__.py":
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def exception_classes() -> dict[str, type]:
    """Every exception class defined at the top of a module of the package, by its dotted name."""
    out = {}
    for name in modules():
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__ == name and issubclass(obj, BaseException):
                out[f"{name}.{attr}"] = obj
    return out


def test_every_exception_class_derives_from_the_root():
    found = exception_classes()
    outside = sorted(n for n, c in found.items() if not issubclass(c, NeuronBuildError))
    assert outside == sorted(OUTSIDE_ROOT)
    # the scan sees the classes it should: the root's own family and those brought under it
    for name in ("neuron_build.errors.UserError", "neuron_build.compilers.base.CompileFailed",
                 "neuron_build.store.core.ReadOnlyStore", "neuron_build.compilers.graph_key.GraphHit"):
        assert name in found


def test_no_exception_class_is_defined_inside_a_function():
    """A class made in a function body escapes the scan above; none is an exception today."""
    nested = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top:
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(("Error", "Exception", "Failed")) for b in bases):
                    nested.append(f"{name}.{node.name}({', '.join(bases)})")
    assert nested == []


def test_the_builtin_bases_are_kept_and_the_exit_statuses_hold():
    from neuron_build.compilers.base import EXIT_TOOLCHAIN_MISSING, CompileFailed
    from neuron_build.hf import HFSourceError
    from neuron_build.status import Status
    from neuron_build.store.core import ReadOnlyStore

    ro = ReadOnlyStore(30, "store file:///s is opened read-only")
    assert isinstance(ro, OSError) and ro.errno == 30 and exit_code(ro) == ExitCode.USAGE == 2
    assert isinstance(HFSourceError("x"), ValueError) and exit_code(HFSourceError("x")) == 1
    missing = CompileFailed(Status.TOOLCHAIN_MISSING, "no neuronx-cc", EXIT_TOOLCHAIN_MISSING)
    assert (missing.exit_code, exit_code(missing)) == (3, 3)  # the worker exits with it
    assert exit_code(CompileFailed(Status.ERROR, "bad")) == 1
