"""Rules of the code that a scan of the source checks: the command line writes through its one output seam
(``neuron_build/cli/app.py``), and no module imports another's private name (a name another module needs
is public, with a docstring)."""

from __future__ import annotations

import ast

from tests.helpers.cli import REPO

PKG = REPO / "neuron_build"
CLI = PKG / "cli"
#: The output seam: the functions of ``cli/app.py`` that write to stdout or stderr.
SEAM = frozenset({"display_text", "display_line", "display_note", "display_error", "print_json"})


def bare_writes(source: str, allowed: frozenset[str] = frozenset()) -> list[int]:
    """The lines of each ``print(...)`` and ``sys.stdout``/``sys.stderr`` ``.write(...)`` in ``source``
    outside the functions named in ``allowed``."""
    tree = ast.parse(source)
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in allowed:
            inside |= {id(n) for n in ast.walk(fn)}
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call) or id(n) in inside:
            continue
        f = n.func
        if (isinstance(f, ast.Name) and f.id == "print") or (
                isinstance(f, ast.Attribute) and f.attr == "write" and ast.unparse(f.value) in ("sys.stdout", "sys.stderr")):
            out.append(n.lineno)
    return sorted(out)


def test_the_command_line_writes_only_through_its_output_seam():
    found = [f"{p.relative_to(REPO)}:{line}" for p in sorted(CLI.glob("*.py"))
             for line in bare_writes(p.read_text(), SEAM if p.name == "app.py" else frozenset())]
    assert found == []


def test_the_scan_finds_a_bare_print_and_a_bare_write():
    src = ("import sys\n\n\ndef display_text(t):\n    print(t)\n\n\ndef f():\n    print('a')\n"
           "    sys.stderr.write('b')\n    display_text('c')\n    out.write('d')\n")
    assert bare_writes(src, frozenset({"display_text"})) == [9, 10]
    assert bare_writes(src) == [5, 9, 10]


#: ``module:name`` of private names imported across modules: none (the graph probe starts its worker
#: through ``build/local.py``'s public ``spawn_worker`` and ``kill_group``, as the local executor does).
PRIVATE_IMPORTS_LEFT: set[str] = set()


def private_imports(source: str, module: str) -> list[str]:
    """``<module>:<source module>.<name>`` of each ``from neuron_build... import _name`` in ``source``
    whose source module is not ``module`` itself (``__dunder__`` names are not private)."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "neuron_build" \
                and n.module != module:
            out += [f"{module}:{n.module}.{a.name}" for a in n.names
                    if a.name.startswith("_") and not a.name.endswith("__")]
    return out


def test_no_private_name_is_imported_across_modules():
    found = []
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found += private_imports(p.read_text(), module)
    assert sorted(found) == sorted(PRIVATE_IMPORTS_LEFT)


def test_the_scan_finds_a_private_import():
    src = ("from neuron_build.a import _b, c, __version__\nfrom neuron_build.x import _own\n"
           "def f():\n    from neuron_build.d import _e\nfrom os import _exit\n")
    assert private_imports(src, "neuron_build.x") == ["neuron_build.x:neuron_build.a._b",
                                                      "neuron_build.x:neuron_build.d._e"]
