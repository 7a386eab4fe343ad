"""The factory's working directory (issue 40, item 6): a compile runs in a fresh temporary folder (no
cwd-relative caches), so ``kwargs = { weights = "weights/x.pt" }`` failed with a bare FileNotFoundError. A
string kwarg that names a file or folder under the project folder is passed as its absolute path; any other
relative path the factory cannot open is one line naming the factory, the path and the folder it was
resolved against."""

from __future__ import annotations

import pytest

from neuron_build.examples import build_model, resolve_path_kwargs
from tests.helpers.cli import run_cli
from tests.helpers.projects import edit, write_tiny_project

FILES = '''
from pathlib import Path

import torch


def from_file(weights: str, name: str = "bert"):
    scale = float(Path(weights).read_text())
    lin = torch.nn.Linear(16, 3)
    with torch.no_grad():
        lin.weight.fill_(scale)
    return lin


def hard_coded():
    open("weights/missing.pt", "rb")
'''


@pytest.fixture
def proj(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    (cfg.parent / "tinylib" / "files.py").write_text(FILES)
    (cfg.parent / "weights").mkdir()
    (cfg.parent / "weights" / "x.txt").write_text("0.5\n")
    return cfg


def test_a_relative_kwarg_naming_a_project_file_is_passed_absolute(proj, tmp_path, monkeypatch):
    root = proj.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)             # as the worker: a fresh folder, not the project's
    kw = {"weights": "weights/x.txt", "name": "bert", "n": 3, "url": "s3://b/weights/x.txt"}
    assert resolve_path_kwargs(root, kw) == {**kw, "weights": str(root / "weights" / "x.txt")}
    model = build_model(str(root), "tinylib.files:from_file", {"weights": "weights/x.txt"}, "fp32")
    assert float(model.weight[0, 0]) == 0.5
    with pytest.raises(FileNotFoundError) as e:
        build_model(str(root), "tinylib.files:hard_coded", {}, "fp32")
    assert str(e.value) == (
        f"factory tinylib.files:hard_coded could not open 'weights/missing.pt': a compile runs in a fresh "
        f"temporary folder ({elsewhere}), not the project folder; name the file in kwargs (a relative path "
        f"there is resolved against {root}) or open it relative to the factory's module (Path(__file__).parent)")


def test_the_build_of_a_factory_opening_a_relative_path_fails_in_one_line(proj):
    edit(proj, 'factory = "tinylib.other:build"', 'factory = "tinylib.files:hard_coded"')
    r = run_cli("build", "-c", str(proj), "other")
    assert r.returncode == 1, r.stdout + r.stderr
    line = [x for x in r.stdout.splitlines() if x.strip().startswith("FAILED other/static/fp32/p1")]
    assert len(line) == 1 and "could not open 'weights/missing.pt': a compile runs in a fresh temporary folder" \
        in line[0], r.stdout


def test_the_issues_kwargs_weights_path_builds(proj):
    """The issue's own case through a real worker: ``kwargs = { weights = "weights/x.txt" }`` compiles."""
    edit(proj, 'factory = "tinylib.other:build"', 'factory = "tinylib.files:from_file"\n'
                                                  'kwargs = { weights = "weights/x.txt" }')
    r = run_cli("build", "-c", str(proj), "other")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 built" in r.stdout
    # the file is read through its absolute path under the project folder: recorded, so a change rebuilds
    (proj.parent / "weights" / "x.txt").write_text("0.25\n")
    r = run_cli("build", "-c", str(proj), "other")
    assert r.returncode == 0 and "1 built" in r.stdout, r.stdout + r.stderr


def test_the_project_folder_comes_first_even_when_pythonpath_names_it_later(tmp_path, monkeypatch):
    """With the project on PYTHONPATH after a folder holding a package of the same name (an editable
    neuron-build checkout's ``models/``, first on a worker's PYTHONPATH), ``models.tiny:build`` was imported
    from that folder: ``No module named 'models.tiny'`` (the graph probe), or another project's model."""
    import sys

    from neuron_build.examples import load_factory

    for where, says in (("other", "other"), ("proj", "mine")):
        (tmp_path / where / "models").mkdir(parents=True)
        (tmp_path / where / "models" / "__init__.py").write_text("")
        (tmp_path / where / "models" / "net.py").write_text(f"def build():\n    return {says!r}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "other"), str(tmp_path / "proj"), *sys.path])
    for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert load_factory(tmp_path / "proj", "models.net:build")() == "mine"
        assert sys.path[0] == str(tmp_path / "proj") and sys.path.count(str(tmp_path / "proj")) == 1
    finally:  # the test's own models package leaves (monkeypatch puts back any that was there)
        for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
            del sys.modules[name]
