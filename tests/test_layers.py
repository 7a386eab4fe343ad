"""The layering rules, enforced: which layer may import which, no import cycles (deferred imports
included), and the torch-free paths stay torch-free.

Layers (:data:`LAYERS`; the table in ``docs/architecture.md``, which ``tests/test_docs_match.py`` holds to
:data:`ALLOWED`): core (errors, status, util, log, the backend records, hf, trust, cpu_isa, traffic, remote_options, the
package); project (config, compiler args, matrix, keys) and store, siblings over core (neither imports the
other); the workspace (the opened project: keys, states, changes, the store opened) over both, no compilers, so
release may take one; compilers (and the worker, the example inputs, the artifact loader) over project, never the store;
build and evaluate over store and compilers, build in wings (``build.graph``: the graph key, which the build
core uses and which uses the core; ``build.fleet``: the Dask executor, its workers and scheduling, over the core;
``build.doit``: the doit glue, over the core and the fleet's predictor; the core imports neither, the fleet not the
doit glue); release over evaluate; runtime over the compilers alone, its
routing rules (``neuron_build.runtime.routing``) a layer of their own over core only (pure, torch-free,
testable alone), and the pulled-release record (``neuron_build.runtime.pulled``, the one module that spells
``release.json``) one over core that the compilers, release, runtime and routing read; tasks over build and evaluate; cli over all. A module may import its own layer and the layers
its row in :data:`ALLOWED` names.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import REPO

PKG = REPO / "neuron_build"

#: layer -> module-name prefixes (longest match wins)
LAYERS = {
    "core": ["neuron_build", "neuron_build.backends", "neuron_build.errors", "neuron_build.status", "neuron_build.util",
             "neuron_build.log", "neuron_build.hf"],
    "project": ["neuron_build.project"],
    "store": ["neuron_build.store"],
    "workspace": ["neuron_build.workspace"],
    "compilers": ["neuron_build.compilers", "neuron_build.worker", "neuron_build.examples", "neuron_build.artifact"],
    "build": ["neuron_build.build"],
    "build.graph": ["neuron_build.build.graph"],
    "build.fleet": ["neuron_build.build.fleet"],
    "build.doit": ["neuron_build.build.doit"],
    "evaluate": ["neuron_build.evaluate"],
    "release": ["neuron_build.release"],
    "runtime": ["neuron_build.runtime"],
    "routing": ["neuron_build.runtime.routing"],
    "pulled": ["neuron_build.runtime.pulled"],
    "tasks": ["neuron_build.tasks"],
    "cli": ["neuron_build.cli"],
}
#: layer -> the other layers it may import
ALLOWED = {
    "core": set(),
    "project": {"core"},
    "store": {"core"},
    "workspace": {"core", "project", "store"},
    "compilers": {"core", "project", "pulled"},
    "build": {"core", "project", "store", "workspace", "compilers", "build.graph"},
    "build.graph": {"core", "project", "store", "workspace", "compilers", "build"},
    "build.fleet": {"core", "project", "store", "workspace", "compilers", "build", "build.graph"},
    # the doit glue reads the fleet's predictor (build/fleet/predict.py) for the progress display's pending seconds
    "build.doit": {"core", "project", "store", "workspace", "compilers", "build", "build.graph", "build.fleet"},
    "evaluate": {"core", "project", "store", "compilers"},
    "release": {"core", "project", "store", "workspace", "compilers", "evaluate", "pulled"},
    "runtime": {"core", "compilers", "routing", "pulled"},
    "routing": {"core", "pulled"},
    "pulled": {"core"},
    "tasks": {"core", "project", "store", "workspace", "compilers", "build", "build.doit", "evaluate"},
    "cli": {"core", "project", "store", "workspace", "compilers", "build", "build.graph", "build.fleet", "build.doit",
            "evaluate", "release", "runtime", "routing", "pulled", "tasks"},
}


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def layer_of(mod: str) -> str:
    best = max(((pre, name) for name, pres in LAYERS.items() for pre in pres
                if mod == pre or mod.startswith(pre + ".")), key=lambda x: len(x[0]))
    return best[1]


def imports_of(mod: str, path: Path, known: set[str]) -> set[str]:
    """Every neuron_build module ``mod`` imports, anywhere in its body (deferred imports included)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "neuron_build" or n.startswith("neuron_build."))
    return {n for n in out if n in known} - {mod}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, p, set(mods)) for m, p in mods.items()}


def test_every_module_has_a_layer():
    for m in modules():
        assert layer_of(m) in ALLOWED, m


def test_layers_import_only_downwards():
    bad = []
    for m, deps in graph().items():
        lm = layer_of(m)
        for d in sorted(deps):
            ld = layer_of(d)
            if ld != lm and ld not in ALLOWED[lm]:
                bad.append(f"{m} ({lm}) imports {d} ({ld})")
    assert bad == []


def test_no_import_cycles():
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_layer_rules_can_fail(tmp_path):
    """The checker sees a deferred import: a function-level import of the CLI from the store is caught."""
    probe = tmp_path / "_layer_probe.py"
    probe.write_text("def f():\n    from neuron_build.cli import main\n")
    deps = imports_of("neuron_build.store._layer_probe", probe, set(modules()))
    assert deps == {"neuron_build.cli"}
    assert "cli" not in ALLOWED[layer_of("neuron_build.store._layer_probe")]


def test_torch_free_imports():
    """``import neuron_build`` and every module the no-op path loads import neither torch nor a compiler."""
    code = ("import sys, neuron_build, neuron_build.tasks, neuron_build.cli, neuron_build.store, "
            "neuron_build.release, neuron_build.build.builder, neuron_build.workspace, neuron_build.runtime.routing; "
            "print(sorted(m for m in ('torch', 'neuronx_cc', 'torch_neuronx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr


def test_no_untyped_builder_crosses_a_function():
    """No ``builder: Any`` (nor an unannotated ``builder``) parameter: a function that takes the Builder says
    so by type, and one that only reads the plan takes a :class:`~neuron_build.workspace.Workspace` (issue 41:
    ``release/create.py`` took an untyped builder, a layer crossing no import showed)."""
    loose = []
    for mod, path in modules().items():
        for node in ast.walk(ast.parse(path.read_bytes())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                    if a.arg == "builder" and (a.annotation is None or ast.unparse(a.annotation) in
                                                      ("Any", "'Any'", "object")):
                        loose.append(f"{mod}:{node.lineno} {node.name}({a.arg})")
    assert loose == []
    assert "builder: Any" not in "".join(p.read_text() for p in modules().values())


def test_build_is_a_core_and_its_wings():
    """``build/`` holds its core at the top (at most 14 modules besides ``__init__.py``; 29 before issue 41
    put the graph key, the fleet and the doit glue in wings) and each wing is a layer of its own above."""
    top = sorted(p.name for p in (PKG / "build").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 14, top
    wings = sorted(p.parent.name for p in (PKG / "build").glob("*/__init__.py"))
    assert wings == ["doit", "fleet", "graph"]
    assert {f"build.{w}" for w in wings} <= set(LAYERS)
    assert not {"build.fleet", "build.doit"} & ALLOWED["build"] and "build.doit" not in ALLOWED["build.fleet"]
