"""The usual conventions and the JSON contract: --version, the config found from a subfolder and from
NEURON_BUILD_CONFIG, NO_COLOR / FORCE_COLOR, every --json document with its schema, build --json one
object per target, explain --json per component, ages as seconds, exit codes from one table."""

from __future__ import annotations

import io
import json

import pytest

from neuron_build.cli import main
from neuron_build.cli.app import human_age, json_doc, seconds
from neuron_build.errors import ExitCode, exit_code
from neuron_build.log import use_color
from neuron_build.project.config import find_config, load_project
from neuron_build.release.channels import PromotionRefused
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cfg = write_tiny_project(tmp_path_factory.mktemp("conv") / "proj")
    r = run_cli("build", "-c", str(cfg), "--json", "tiny/b1/fp32/p1", "tiny/b4/fp32/p1")
    assert r.returncode == 0, r.stderr
    return cfg, json.loads(r.stdout), r


def test_version(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0
    assert capsys.readouterr().out.strip() == "neuron-build 0.1.0"


def test_config_found_from_a_subfolder_and_from_the_environment(tmp_path, monkeypatch):
    cfg = write_tiny_project(tmp_path / "proj")
    sub = tmp_path / "proj" / "tinylib" / "deeper"
    sub.mkdir(parents=True)
    monkeypatch.delenv("NEURON_BUILD_CONFIG", raising=False)
    monkeypatch.chdir(sub)
    assert find_config() == cfg.resolve()
    assert load_project().path == cfg.resolve()
    other = write_tiny_project(tmp_path / "other")
    monkeypatch.setenv("NEURON_BUILD_CONFIG", str(other))
    assert load_project().path == other.resolve()
    monkeypatch.delenv("NEURON_BUILD_CONFIG")
    monkeypatch.chdir(tmp_path)
    assert find_config() is None
    r = run_cli("plan", cwd=tmp_path, env={"NEURON_BUILD_CONFIG": ""})
    assert r.returncode == 2
    assert "file not found; create it, pass -c PATH or set NEURON_BUILD_CONFIG (looked in " in r.stderr
    assert "and its parents)" in r.stderr


def test_no_color_and_force_color(monkeypatch):
    tty = type("T", (io.StringIO,), {"isatty": lambda self: True})()
    pipe = io.StringIO()
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert use_color(tty) is True and use_color(pipe) is False
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert use_color(pipe) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_color(tty) is False and use_color(pipe) is False  # NO_COLOR wins


def test_json_helpers_and_exit_table():
    assert json_doc([1, 2], "targets", name="plan") == {"schema": "neuron-build/plan/v1", "targets": [1, 2]}
    assert json_doc({"a": 1}, name="show") == {"schema": "neuron-build/show/v1", "a": 1}
    assert json_doc({"a": 1, "schema": "neuron-build.failures/2"}) == {"schema": "neuron-build.failures/2", "a": 1}
    assert seconds(1.23456) == 1.235 and seconds(None) is None
    assert [human_age(x) for x in (None, 5, 125, 7300, 90000)] == ["-", "5s", "2m", "2h", "1d"]
    assert exit_code(PromotionRefused("no", {})) == ExitCode.REFUSED == 3
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 130, 141]


def test_build_json_one_object_per_target_and_plan_ls_explain(built):
    cfg, doc, r = built
    assert doc["schema"] == "neuron-build/build/v1" and doc["verdict"] == "pass"
    assert [t["target"] for t in doc["targets"]] == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1"]
    for t in doc["targets"]:
        assert (t["result"], t["status"], t["verdict"], t["reason"]) == ("built", "PASS", "pass", "")
        assert len(t["key"]) == 64 and isinstance(t["compile_time_s"], float) and t["compile_time_s"] > 0
    assert ".  build:tiny/b1/fp32/p1" in r.stderr and "build:" not in r.stdout  # doit's report off stdout
    # progress: N of M, and an ETA from this run's compile times
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]  # compiles run in parallel: any order
    assert len(lines) == 2 and lines[0].startswith("[1/2] tiny/b") and "; 1 left, about " in lines[0]
    assert lines[1].startswith("[2/2] tiny/b") and " PASS in " in lines[1]
    assert {ln.split()[1] for ln in lines} == {"tiny/b1/fp32/p1", "tiny/b4/fp32/p1"}
    again = json.loads(run_cli("build", "-c", str(cfg), "--json", "tiny/b1/fp32/p1").stdout)
    t = again["targets"][0]
    assert (t["result"], t["status"], t["compile_time_s"]) == ("cached", "cached",
                                                               doc["targets"][0]["compile_time_s"])

    for cmd, items in (("plan", "targets"), ("ls", "artifacts")):
        d = json.loads(run_cli(cmd, "-c", str(cfg), "--json").stdout)
        assert d["schema"] == f"neuron-build/{cmd}/v1" and isinstance(d[items], list) and d[items]

    # explain --json: per component, old and new; a kwargs change shows in the model component
    e = json.loads(run_cli("explain", "-c", str(cfg), "tiny/b1/fp32/p1", "--json").stdout)
    assert e["schema"] == "neuron-build/explain/v1" and e["state"] == "cached"
    comps = {c["name"]: c for c in e["components"]}
    assert all(not c["changed"] and c["old"] == c["new"] and c["old_hash"] == c["new_hash"] for c in comps.values())
    src = cfg.parent / "tinylib" / "act.py"
    src.write_text("def scale(x):\n    return x * 3\n")
    e = json.loads(run_cli("explain", "-c", str(cfg), "tiny/b1/fp32/p1", "--json").stdout)
    comps = {c["name"]: c for c in e["components"]}
    assert e["state"] == "missing" and comps["model"]["changed"] is True
    assert comps["model"]["old_hash"] != comps["model"]["new_hash"]
    assert comps["model"]["old"] != comps["model"]["new"]
    assert [n for n, c in comps.items() if c["changed"]] == ["model"]
    assert e["last"]["key"] == doc["targets"][0]["key"]


def test_the_backend_note_is_not_on_read_commands(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    cfg.write_text(cfg.read_text().replace('backend = "torchscript"', 'backend = "auto"'))
    r = run_cli("plan", "-c", str(cfg))
    assert r.returncode == 0 and "backend auto" not in r.stdout + r.stderr


def test_completion_script_lists_the_commands(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "complete -o bashdefault -F _shtab_neuron_build neuron-build" in script
    for cmd in ("build", "promote", "releases", "init", "completion"):
        assert cmd in script
    assert "--waive" in script


def test_init_scaffolds_a_project_that_plans_and_never_overwrites(tmp_path, capsys):
    root = tmp_path / "new"
    assert main(["init", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"created {root / 'buckets.toml'}" in out and f"created {root / 'models' / 'example.py'}" in out
    assert f"next: cd {root} && neuron-build plan && neuron-build build" in out
    project = load_project(root / "buckets.toml")
    assert list(project.config.models) == ["mlp"]
    assert (root / "dodo.py").read_text().startswith("from neuron_build.tasks import *")
    (root / "models" / "example.py").write_text("# mine\n")
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err
    assert "buckets.toml, dodo.py, models/__init__.py, models/example.py already exist;" in err
    (root / "dodo.py").unlink()
    (root / "buckets.toml").unlink()
    (root / "models" / "__init__.py").unlink()
    assert main(["init", str(root)]) == 2
    assert "models/example.py already exists;" in capsys.readouterr().err
    assert (root / "models" / "example.py").read_text() == "# mine\n"


def test_the_backend_note_never_precedes_a_usage_error(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    cfg.write_text(cfg.read_text().replace('backend = "torchscript"', 'backend = "auto"'))
    r = run_cli("build", "-c", str(cfg), "nosuchmodel")
    assert r.returncode == 2 and "no target matches 'nosuchmodel'" in r.stderr
    assert "backend auto" not in r.stdout + r.stderr
