"""Limits that hold: no module of ``neuron_build/`` over :data:`MAX_MODULE_LINES` lines, no function over
:data:`MAX_FUNCTION_LINES` (from its ``def`` line to its last, docstring included; decorators not counted; a
method or a nested function counts on its own), and ``__all__`` in every module, except the exceptions named
below, each with its reason, as the per-file ignores in pyproject.toml are. An exception no longer needed
fails too, so the lists stay honest. Parsed with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.cli import REPO

PKG = REPO / "neuron_build"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

#: module (path under neuron_build/) -> why it is longer than MAX_MODULE_LINES
LONG_MODULES = {
}

#: "path:qualified name" -> why the function is longer than MAX_FUNCTION_LINES
LONG_FUNCTIONS = {
}

#: module (path under neuron_build/) -> why it has no __all__ yet
NO_ALL_YET = {
}


def sources() -> dict[str, Path]:
    return {p.relative_to(PKG).as_posix(): p for p in sorted(PKG.rglob("*.py"))}


def long_functions(tree: ast.AST, limit: int) -> dict[str, int]:
    """Every function or method in ``tree`` longer than ``limit`` lines, by dotted qualified name."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                length = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > limit:
                    out[name] = length
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def defines_all(tree: ast.Module) -> bool:
    """``__all__`` is bound at the module's top level (an assignment, annotated or not)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return True
    return False


def top_level_names(tree: ast.Module) -> set[str]:
    """Every name the module binds at its top level (inside top-level ``if``, ``try`` and ``with`` blocks too)."""
    names: set[str] = set()

    def scan(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            for block in ("body", "orelse", "finalbody"):
                if isinstance(node, ast.If | ast.Try | ast.With) and hasattr(node, block):
                    scan(getattr(node, block))
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    scan(handler.body)

    scan(tree.body)
    return names


def over_limits(files: dict[str, Path]) -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for rel, path in files.items():
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            modules[rel] = n
        functions.update({f"{rel}:{q}": n for q, n in long_functions(ast.parse(text), MAX_FUNCTION_LINES).items()})
    return modules, functions


def test_no_module_over_the_limit_but_the_named():
    modules, _ = over_limits(sources())
    assert {m: n for m, n in modules.items() if m not in LONG_MODULES} == {}
    stale = sorted(m for m in LONG_MODULES if m not in modules)
    assert stale == [], f"no longer over {MAX_MODULE_LINES} lines (or gone): drop them from LONG_MODULES"


def test_no_function_over_the_limit_but_the_named():
    _, functions = over_limits(sources())
    assert {f: n for f, n in functions.items() if f not in LONG_FUNCTIONS} == {}
    stale = sorted(f for f in LONG_FUNCTIONS if f not in functions)
    assert stale == [], f"no longer over {MAX_FUNCTION_LINES} lines (or gone): drop them from LONG_FUNCTIONS"


def test_every_exception_has_a_one_line_reason():
    for table in (LONG_MODULES, LONG_FUNCTIONS, NO_ALL_YET):
        assert all(reason.strip() and "\n" not in reason for reason in table.values())


def test_every_module_defines_all_but_the_named():
    files = sources()
    missing = sorted(rel for rel, p in files.items() if not defines_all(ast.parse(p.read_text())))
    assert [m for m in missing if m not in NO_ALL_YET] == []
    assert sorted(m for m in NO_ALL_YET if m not in missing) == [], "has __all__ now (or gone): drop from NO_ALL_YET"


def unbound_in_all(tree: ast.Module) -> list[str]:
    """The names a literal ``__all__`` lists that the module does not bind."""
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and isinstance(node.value, ast.List | ast.Tuple):
            names = top_level_names(tree)
            out += [e.value for e in node.value.elts if isinstance(e, ast.Constant) and e.value not in names]
    return out


def test_every_name_in_all_is_bound():
    """A name in ``__all__`` the module does not bind would make ``from module import *`` fail."""
    unbound = [f"{rel}:{n}" for rel, path in sources().items() for n in unbound_in_all(ast.parse(path.read_text()))]
    assert unbound == []


def test_the_checks_can_fail(tmp_path):
    """A long method inside a class, a long nested function and a module without ``__all__`` are all seen."""
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = (f"class C:\n    def m(self):\n{body}\n\n"
           f"def outer():\n    def inner():\n{body}\n    return inner\n")
    tree = ast.parse(src)
    assert long_functions(tree, MAX_FUNCTION_LINES) == {"C.m": MAX_FUNCTION_LINES + 1,
                                                        "outer": MAX_FUNCTION_LINES + 3,
                                                        "outer.inner": MAX_FUNCTION_LINES + 1}
    assert not defines_all(tree)
    assert defines_all(ast.parse("__all__: list[str] = []\n"))
    assert unbound_in_all(ast.parse("import os\nif os:\n    from x import y\ndef f():\n    z = 1\n"
                                    "__all__ = ['os', 'y', 'f', 'z']\n")) == ["z"]
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert over_limits({"big.py": big}) == ({"big.py": MAX_MODULE_LINES + 1}, {})
