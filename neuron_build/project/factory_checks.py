"""The factory and the hf model of a ``[models.NAME]`` table, read statically (part of the checks of
:mod:`neuron_build.project.config_checks`): the factory's module exists, parses, defines the function and
takes the ``kwargs``, the modules it imports are findable; an hf model's folder resolves and transformers
has its auto class. Nothing is imported or executed: ``ast`` and ``importlib.util.find_spec`` only.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from pathlib import Path
from typing import Any

from neuron_build.project.config_errors import toml_path
from neuron_build.project.config_terms import DEFAULT_CONFIG

# The checks read a ModelSpec of neuron_build.project.config_models (named in the docstrings) by attribute.
ModelSpec = Any

def unknown_kwargs(m: ModelSpec, tree: ast.Module, at: tuple[Any, ...]) -> list[str]:
    """``kwargs`` the factory function does not take (read from its ``def``; with a ``**kwargs`` parameter, a
    class, an assigned or a decorated factory is not checked), each with the closest parameter name."""
    fn = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == m.function), None)
    if fn is None or fn.args.kwarg is not None or fn.decorator_list:  # a decorator may change the signature
        return []
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    out = []
    for k in m.kwargs:
        if k not in params:
            close = difflib.get_close_matches(k, params, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"it takes: {', '.join(params) or 'no arguments'}"
            out.append(f"{toml_path(at + ('kwargs', k))}: {m.factory} takes no argument '{k}'; {hint}")
    return out


def check_factory(m: ModelSpec, root: Path, at: tuple[Any, ...]) -> list[str]:
    """Statically check that a factory will import: the module file exists under ``root``, parses, defines
    the function, and every module it imports is findable. Nothing is imported or executed."""
    where = toml_path(at + ("factory",))
    base = root.joinpath(*m.module.split("."))
    path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
    if not path.is_file():
        return [f"{where}: module '{m.module}' not found: expected {path.relative_to(root)} "
                f"beside {DEFAULT_CONFIG} (factory paths are relative to its folder)"]
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as e:
        return [f"{where}: {path.relative_to(root)} does not import: syntax error at line {e.lineno}: {e.msg}"]
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    faults = []
    if m.function not in defined:
        faults.append(f"{where}: {path.relative_to(root)} defines no '{m.function}'; "
                      f"defined: {', '.join(sorted(defined)) or 'nothing'}")
    faults.extend(unknown_kwargs(m, tree, at))
    faults.extend(missing_imports(tree, path, root, where))
    # modules under the models folder that the factory imports must import too
    from neuron_build.project.sources import local_imports

    for dep in local_imports(path, root, module=m.module):
        if dep == path:
            continue
        try:
            dep_tree = ast.parse(dep.read_bytes(), filename=str(dep))
        except SyntaxError as e:
            faults.append(f"{where}: {dep.relative_to(root)} (imported by {path.relative_to(root)}) does not "
                          f"import: syntax error at line {e.lineno}: {e.msg}")
            continue
        faults.extend(missing_imports(dep_tree, dep, root, where, via=path))
    return faults


def check_hf(m: ModelSpec, root: Path, at: tuple[Any, ...]) -> list[str]:
    """Statically check an hf model: its folder (or package) resolves to a folder with config.json and
    weights, transformers is installed and defines the auto class. Nothing is imported."""
    from neuron_build import hf

    faults = []
    try:
        hf.resolve(m.hf or "", root)
    except hf.HFSourceError as e:
        faults.append(f"{toml_path(at + ('hf',))}: {e}")
    known = hf.auto_classes()
    if known is None:
        faults.append(f"{toml_path(at + ('hf',))}: transformers is not installed; install it (pip install "
                      f"transformers) to load hf models")
    else:
        name = m.auto_class or hf.DEFAULT_AUTO_CLASS
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            faults.append(f"{toml_path(at + ('auto_class',))}: transformers has no auto class '{name}'; {hint}"
                          f"e.g. AutoModel, AutoModelForSequenceClassification, AutoModelForCausalLM")
    return faults


def missing_imports(tree: ast.AST, path: Path, root: Path, where: str, via: Path | None = None) -> list[str]:
    """Faults for absolute imports in ``tree`` that resolve neither under ``root`` nor to an installed
    module (found with ``importlib.util.find_spec``; nothing is imported)."""
    faults = []
    shown = f"{path.relative_to(root)}" + (f" (imported by {via.relative_to(root)})" if via else "")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            local = root.joinpath(*node.module.split("."))
            if local.is_dir():
                for a in node.names:
                    if a.name != "*" and not (local / f"{a.name}.py").exists() and not (local / a.name).is_dir():
                        init = local / "__init__.py"
                        if not init.exists() or a.name not in init.read_text(errors="replace"):
                            faults.append(f"{where}: {shown} does not import: '{node.module}.{a.name}' "
                                          f"(line {node.lineno}) not found under {local.relative_to(root)}/")
        for name in names:
            top = name.split(".")[0]
            if (root / top).exists() or (root / f"{top}.py").exists():
                continue
            if importlib.util.find_spec(top) is None:
                faults.append(f"{where}: {shown} does not import: module '{top}' "
                              f"(line {node.lineno}) is not installed")
    return faults


__all__ = ["check_factory", "check_hf", "missing_imports", "unknown_kwargs"]
