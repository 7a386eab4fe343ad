"""The docs say what the code does: the architecture page's layer table is ``tests/test_layers.py``'s rules and
names every module; the count of promotion gates in prose is the length of :data:`GATES`, and the releases page
has a row for each.
"""

from __future__ import annotations

import re
from pathlib import Path

from neuron_build.release.gates import GATES
from tests.helpers.cli import REPO
from tests.test_layers import ALLOWED, LAYERS, layer_of, modules

ARCH = REPO / "docs" / "architecture.md"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
           "ten": 10, "eleven": 11, "twelve": 12}


def layer_table(text: str) -> dict[str, tuple[str, str]]:
    """The architecture page's layer table: layer -> (its modules cell, its may-import cell)."""
    rows = re.findall(r"^\| ([\w.]+) \| (.+?) \| (.+?) \|$", text, re.M)
    return {layer: (mods, may) for layer, mods, may in rows if layer != "layer"}


def may_import(cell: str, layer: str) -> set[str]:
    if cell == "nothing of the package":
        return set()
    if cell == "every layer above":
        return set(ALLOWED) - {layer}
    return {w.strip() for w in cell.split(",")}


def test_the_layer_table_is_the_layer_rules():
    table = layer_table(ARCH.read_text())
    assert list(table) == list(LAYERS)
    assert {layer: may_import(may, layer) for layer, (_, may) in table.items()} == ALLOWED
    # project and store are siblings, in the rules as in the page
    assert "store" not in ALLOWED["project"] and "project" not in ALLOWED["store"]


def test_the_layer_table_places_every_module():
    """A top-level module is named in its layer's row (`` `x` ``), a package's modules by the package (`` `x/` ``)
    or by the subpackage that is a layer of its own (`` `x/y/` ``)."""
    table = layer_table(ARCH.read_text())
    missing = []
    for mod, path in modules().items():
        rel = path.relative_to(REPO / "neuron_build").parts
        if mod == "neuron_build":
            want = "the package"
        elif len(rel) == 1:
            want = f"`{rel[0].removesuffix('.py')}`"
        else:  # its package, or the package's own wing (`build/graph/`)
            want = " or ".join(f"`{'/'.join(rel[:i])}/`" for i in range(len(rel) - 1, 0, -1))
        if not any(w in table[layer_of(mod)][0] for w in want.split(" or ")):
            missing.append(f"{mod}: {want} in the {layer_of(mod)} row")
    assert missing == []


def module_tree(text: str) -> tuple[str, dict[str, str]]:
    """The page's indented tree of ``neuron_build/``: all its text, and each top-level package's entry."""
    lines = text.split("\n")
    start = lines.index("    neuron_build/")
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"^    \S", lines[i]))
    blocks: dict[str, list[str]] = {}
    current = ""
    for line in lines[start + 1:end]:
        head = re.match(r"^ {6}(\S+)", line)
        if head:  # a new entry at the tree's first level
            current = head[1] if head[1].endswith("/") else ""
        blocks.setdefault(current, []).append(line)
    return "\n".join(lines[start + 1:end]), {k: "\n".join(v) for k, v in blocks.items()}


def named(name: str, text: str) -> bool:
    return re.search(r"(?<![\w/.])" + re.escape(name) + r"(?!\w)", text) is not None


def unnamed_modules(text: str, package: Path) -> list[str]:
    """Modules of ``package`` the page's tree does not name: a top-level ``x.py`` anywhere in the tree, a
    package's ``y.py`` in that package's entry, a subpackage by its folder (``neuron/``) there."""
    whole, blocks = module_tree(text)
    out = []
    for p in sorted(package.rglob("*.py")):
        rel = p.relative_to(package).parts
        if len(rel) == 1:
            ok = named(rel[0], whole)
        elif rel[-1] == "__init__.py":
            ok = len(rel) == 2 or named(rel[-2] + "/", blocks.get(rel[0] + "/", ""))
        else:
            ok = named(rel[-1], blocks.get(rel[0] + "/", ""))
        if not ok:
            out.append("/".join(rel))
    return out


def test_the_architecture_page_names_every_module():
    assert unnamed_modules(ARCH.read_text(), REPO / "neuron_build") == []


def test_a_module_missing_from_the_page_is_found(tmp_path):
    """The check can fail: a module the page does not name, and one named only in another package's entry."""
    pkg = tmp_path / "neuron_build"
    (pkg / "build").mkdir(parents=True)
    (pkg / "store").mkdir()
    for f in ("errors.py", "build/planner.py", "build/ghost.py", "store/planner_twin.py", "store/reads.py"):
        (pkg / f).write_text("")
    page = ("    neuron_build/\n      errors.py   core\n      build/      planner.py\n"
            "      store/      planner_twin.py (see build/reads.py)\n    models/\n")
    assert unnamed_modules(page, pkg) == ["build/ghost.py", "store/reads.py"]


def number_of_gates(text: str) -> list[int]:
    return [NUMBERS[w.lower()] for w in re.findall(r"\b(\w+) promotion gates\b", text) if w.lower() in NUMBERS]


def test_the_gate_count_in_prose_is_the_gates():
    texts = {p: p.read_text() for p in [*(REPO / "neuron_build").rglob("*.py"), *(REPO / "docs").glob("*.md"),
                                         REPO / "README.md"]}
    counts = {str(p.relative_to(REPO)): n for p, t in texts.items() for n in number_of_gates(t)}
    assert counts, "the gates module says how many gates there are"
    assert {p: n for p, n in counts.items() if n != len(GATES)} == {}
    assert number_of_gates("the six promotion gates") == [6]


def test_the_releases_page_has_a_row_per_gate():
    rows = re.findall(r"^\| `(\w+)` \|", (REPO / "docs" / "releases.md").read_text(), re.M)
    assert [r for r in rows if r in GATES] == list(GATES)

