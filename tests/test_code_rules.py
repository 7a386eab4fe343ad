"""Rules of the code that a scan of the source checks: the command line writes through its one output seam
(``neuron_build/cli/app.py``)."""

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
