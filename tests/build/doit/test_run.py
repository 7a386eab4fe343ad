"""doit through its extension points: neuron-build patches nothing of doit and walks no caller frames;
its exit codes come from a ``Run`` subclass that doit loads as its ``run`` command plugin."""

from __future__ import annotations

import ast
import subprocess
import sys

import tomllib

from tests.helpers.cli import REPO

PKG = REPO / "neuron_build"


def _doit_names(tree: ast.Module) -> set[str]:
    """Names a module binds to doit's modules and classes (``import doit...``, ``from doit... import X``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "doit":
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "doit"}
    return names


def doit_patches(source: str, tasks: bool = False) -> list[str]:
    """Assignments to (or ``setattr`` on) an attribute of a doit name; in a module that uses doit (or is
    ``tasks.py``), ``sys._getframe`` (reading doit's locals from its frames)."""
    tree = ast.parse(source)
    doit = _doit_names(tree)
    found = []

    def base(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "_getframe" and base(node) == "sys"
                and (doit or tasks)):
            found.append(f"line {node.lineno}: sys._getframe")
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and node.args and base(node.args[0]) in doit):
            found.append(f"line {node.lineno}: {node.func.id} on {base(node.args[0])}")
        for t in targets:
            for sub in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if isinstance(sub, ast.Attribute) and base(sub) in doit:
                    found.append(f"line {node.lineno}: assigns {ast.unparse(sub)}")
    return found


def test_the_checker_sees_a_patch_and_a_frame_walk():
    src = ("import sys\nfrom doit.runner import Runner\nimport doit.cmd_run as cr\n"
           "Runner._handle_task_error = None\ncr.Run._execute = None\nsetattr(Runner, 'x', 1)\n"
           "f = sys._getframe(1)\nmine = object()\nmine.attr = 1\n")
    assert doit_patches(src) == ["line 4: assigns Runner._handle_task_error", "line 5: assigns cr.Run._execute",
                                 "line 6: setattr on Runner", "line 7: sys._getframe"]


def test_no_module_patches_doit_or_walks_frames():
    files = sorted(PKG.rglob("*.py"))
    bad = {str(p.relative_to(REPO)): f for p in files if (f := doit_patches(p.read_text(), p.name == "tasks.py"))}
    assert bad == {}
    assert len(files) > 50 and any(_doit_names(ast.parse(p.read_text())) for p in files)  # it looked
    assert (PKG / "tasks.py").is_file() and "_getframe" not in (PKG / "tasks.py").read_text()


def test_build_run_is_doits_run_command_plugin():
    from doit.cmd_run import Run
    from doit.doit_cmd import DoitMain

    from neuron_build.build.doit.run import BuildMain, BuildRun

    py = tomllib.loads((REPO / "pyproject.toml").read_text())
    where = "neuron_build.build.doit.run:BuildRun"
    assert py["project"]["entry-points"]["doit.COMMAND"] == {"run": where}
    assert py["tool"]["doit"]["plugins"]["command"] == {"run": where}
    assert issubclass(BuildRun, Run) and BuildRun.get_name() == "run"
    cmds = DoitMain(config_filenames=(str(REPO / "pyproject.toml"),)).get_cmds()
    assert cmds.get_plugin("run") is BuildRun
    assert issubclass(BuildMain().get_cmds().get_plugin("run"), BuildRun)


def test_another_dodo_keeps_doits_exit_codes(tmp_path):
    """Loaded for every dodo.py in this checkout, BuildRun is doit's own run for one that is not
    neuron-build's: an unknown task exits 3, a failed group task 2."""
    (tmp_path / "dodo.py").write_text(
        "def task_g():\n"
        "    yield {'name': 'ok', 'actions': ['true']}\n"
        "    yield {'name': 'bad', 'actions': ['false']}\n")

    def doit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "doit", "-f", str(tmp_path / "dodo.py"), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)

    r = doit("nosuch")
    assert r.returncode == 3 and r.stderr.startswith('ERROR: Invalid parameter: "nosuch".'), r.stderr
    r = doit("--continue", "g")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "UnmetDependency" in r.stdout + r.stderr


def test_the_plan_cache_reads_state_dir_as_the_config_does(tmp_path):
    """The no-op path's ``state_dir`` is the config reader's: its default, its value, and the same error."""
    import pytest

    from neuron_build.errors import ConfigError
    from neuron_build.project.config import BuildSettings, load_project
    from neuron_build.project.config_file import state_dir_setting

    assert state_dir_setting("b.toml", b"[models.m]\n") == BuildSettings().state_dir == ".neuron-build"
    assert state_dir_setting("b.toml", b'[build]\nstate_dir = "st"\n') == "st"
    assert state_dir_setting("b.toml", b"[build]\nstate_dir = 3\n") is None
    bad = tmp_path / "buckets.toml"
    bad.write_bytes(b"\xef\xbb\xbf[build]\nstate_dir = 'x'\n")
    with pytest.raises(ConfigError) as fast:
        state_dir_setting(str(bad), bad.read_bytes())
    with pytest.raises(ConfigError) as full:
        load_project(bad)
    assert str(fast.value) == str(full.value) and "byte-order mark" in str(full.value)
