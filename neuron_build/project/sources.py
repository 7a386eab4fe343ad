"""Which source files a model's factory runs: the project-local modules it imports (read statically).

A leaf of the project layer: both the config check (every import resolves) and the key (every module's
source is hashed) use it, so neither imports the other.
"""

from __future__ import annotations

import ast
from pathlib import Path


def local_imports(entry: Path, top: Path) -> list[Path]:
    """The module files under ``top`` that ``entry`` imports, directly or transitively (static, via ast).

    Args:
        entry: the factory module file.
        top: the models folder (the factory's top-level package folder).

    Returns:
        Sorted paths, ``entry`` included.
    """
    root = top.parent
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        try:
            tree = ast.parse(f.read_bytes())
        except SyntaxError:
            continue
        pkg_parts = list(f.relative_to(root).with_suffix("").parts)
        if pkg_parts[-1] == "__init__":
            pkg_parts = pkg_parts[:-1]
        else:
            pkg_parts = pkg_parts[:-1]
        for node in ast.walk(tree):
            mods: list[list[str]] = []
            if isinstance(node, ast.Import):
                mods = [a.name.split(".") for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = (pkg_parts[: len(pkg_parts) - node.level + 1] if node.level else [])
                mod = base + (node.module.split(".") if node.module else [])
                mods = [mod] + [mod + [a.name] for a in node.names]
            for parts in mods:
                for n in range(1, len(parts) + 1):
                    cand = root.joinpath(*parts[:n])
                    for c in (cand.with_suffix(".py"), cand / "__init__.py"):
                        if c.is_file() and top in c.parents:
                            todo.append(c)
    return sorted(seen)
