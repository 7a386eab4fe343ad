"""What a factory reads at build time besides its declared inputs (a data file it opens, by Python or by native
code, an environment variable it reads, the version of a distribution it imports) is recorded by the worker in
the artifact's manifest and checked at every lookup: the key itself holds the declared inputs only, so the key
``plan`` shows before a first build is the key the artifact is published under (ccache's direct mode)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.build.executor import compile_request
from neuron_build.project.config import load_project
from neuron_build.project.reads import ReadRecorder
from neuron_build.workspace import Workspace
from tests.helpers.projects import write_tiny_project

TARGET = "other/static/fp32/p1"
FACTORY = '''\
import importlib
import os

import gkdep
import torch


def build():
    torch.manual_seed(1)
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "scale.txt")) as f:
        scale = float(f.read())
    width = int(os.getenv("GK_OTHER_WIDTH", "3"))
    extra = importlib.import_module("tinylib.by" + "name").EXTRA  # no static reading finds it
    return torch.nn.Linear(16, width + gkdep.EXTRA + extra + int(scale) * 0)
'''


def dist(site: Path, version: str) -> None:
    """A distribution ``gkdep`` installed in ``site`` (a folder on sys.path), at ``version``."""
    (site / "gkdep").mkdir(parents=True, exist_ok=True)
    (site / "gkdep" / "__init__.py").write_text("EXTRA = 0\n")
    for old in site.glob("gkdep-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"gkdep-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gkdep\nVersion: {version}\n")
    (info / "top_level.txt").write_text("gkdep\n")
    (info / "RECORD").write_text("gkdep/__init__.py,,\n")


def state(cfg: Path) -> tuple[str, list[str]]:
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id[TARGET]
    out = (str(b.ws.state(t)), b.ws.changed(t)[0])
    b.ws.keys.save()
    return out


def test_what_a_build_read_is_checked_at_lookup_and_the_planned_key_is_the_published_key(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("GK_OTHER_WIDTH", raising=False)
    cfg = write_tiny_project(tmp_path / "proj")
    (cfg.parent / "tinylib" / "other.py").write_text(FACTORY)
    (cfg.parent / "tinylib" / "byname.py").write_text("EXTRA = 0\n")
    (cfg.parent / "data").mkdir()
    (cfg.parent / "data" / "scale.txt").write_text("2.0")

    planned = Builder(Workspace(load_project(cfg)))
    planned_key = planned.ws.key(planned.ws.by_id[TARGET]).key
    planned.ws.keys.save()
    b = Builder(Workspace(load_project(cfg)))
    out = b.build(b.ws.by_id[TARGET])
    b.ws.keys.save()
    assert out.ok and out.compiled
    assert out.key == planned_key  # the key plan showed before the first build is the one published
    man = b.ws.store.manifest(planned_key)
    assert man is not None and man.key == planned_key
    rec = man.recorded_inputs
    assert list(rec["files"]) == ["data/scale.txt"] and rec["env"] == {"GK_OTHER_WIDTH": None}
    assert list(rec["imports"]) == ["tinylib/byname.py"]
    assert rec["dists"]["gkdep"] == "1.0" and "neuron-build" not in rec["dists"] and "torch" not in rec["dists"]
    assert state(cfg) == ("cached", [])
    assert Workspace(load_project(cfg)).key(b.ws.by_id[TARGET]).key == planned_key  # and the next plan's

    (cfg.parent / "data" / "scale.txt").write_text("3.0")
    assert state(cfg) == ("missing", ["recorded read data/scale.txt changed"])
    (cfg.parent / "data" / "scale.txt").write_text("2.0")
    assert state(cfg) == ("cached", [])

    monkeypatch.setenv("GK_OTHER_WIDTH", "3")
    assert state(cfg) == ("missing", ["recorded variable GK_OTHER_WIDTH changed"])
    monkeypatch.delenv("GK_OTHER_WIDTH")
    assert state(cfg) == ("cached", [])

    (cfg.parent / "tinylib" / "byname.py").write_text("EXTRA = 0  # edited\n")
    assert state(cfg) == ("missing", ["recorded import tinylib/byname.py changed"])
    (cfg.parent / "tinylib" / "byname.py").write_text("EXTRA = 0\n")

    dist(site, "2.0")
    assert state(cfg) == ("missing", ["recorded distribution gkdep changed"])
    # the rebuild keeps the key and replaces the stale record
    b = Builder(Workspace(load_project(cfg)))
    out = b.build(b.ws.by_id[TARGET])
    assert out.ok and out.key == planned_key
    assert b.ws.store.manifest(planned_key).recorded_inputs["dists"]["gkdep"] == "2.0"
    assert state(cfg) == ("cached", [])


# -- native reads: whatever code opens a file, the recorder sees it ------------------------------------------
def _tensors(path: Path, value: float) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.full((4,), value)}, str(path))


NATIVE = {
    "safetensors load_file": lambda p: __import__("safetensors.torch", fromlist=["load_file"]).load_file(str(p)),
    "safetensors safe_open": lambda p: _safe_open(p),
    "torch.from_file": lambda p: __import__("torch").from_file(str(p), size=4, dtype=__import__("torch").uint8),
}


def _safe_open(p: Path):
    from safetensors import safe_open

    with safe_open(str(p), framework="pt") as f:
        return f.get_tensor("w")


@pytest.mark.parametrize("how", sorted(NATIVE))
def test_a_file_read_by_native_code_is_recorded(tmp_path, how):
    root = tmp_path / "proj"
    (root / "ckpt").mkdir(parents=True)
    _tensors(root / "ckpt" / "w.safetensors", 1.0)
    with ReadRecorder(root) as rec:
        NATIVE[how](root / "ckpt" / "w.safetensors")
    assert rec.files == {"ckpt/w.safetensors"} and rec.incomplete is None


def test_a_file_this_process_mapped_before_the_block_is_no_read_and_one_it_maps_again_is(tmp_path, monkeypatch):
    """A process that serves a release keeps its weights mapped (safetensors): a recorder started later (an
    in-process probe, a test after another) counted that old mapping as the block's read. Only mappings made
    while the block ran count; a file the block maps again (new addresses) is its read."""
    from safetensors.torch import load_file

    home = tmp_path / "home"
    (home / "ckpt").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    _tensors(home / "ckpt" / "w.safetensors", 1.0)
    held = load_file(str(home / "ckpt" / "w.safetensors"))  # mapped before any block, kept
    root = tmp_path / "proj"
    root.mkdir()
    with ReadRecorder(root) as idle:
        pass
    assert "~/ckpt/w.safetensors" not in idle.files and idle.incomplete is None
    with ReadRecorder(root) as rec:
        again = load_file(str(home / "ckpt" / "w.safetensors"))
    assert "~/ckpt/w.safetensors" in rec.files
    assert float(held["w"][0]) == float(again["w"][0]) == 1.0


@pytest.mark.parametrize("how", sorted(NATIVE))
def test_a_checkpoint_in_a_hidden_or_linked_folder_is_recorded(tmp_path, how):
    """A hidden folder that is not VCS or a tool's cache (``.weights/``), and a folder the project links to
    (``link -> /data/ckpt``), are project folders: what the factory reads there, natively too, is recorded
    under the name the project gives it."""
    root = tmp_path / "proj"
    (root / ".weights").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (root / "link").symlink_to(tmp_path / "data", target_is_directory=True)
    _tensors(root / ".weights" / "w.safetensors", 1.0)
    _tensors(tmp_path / "data" / "w.safetensors", 1.0)
    with ReadRecorder(root) as rec:
        NATIVE[how](root / ".weights" / "w.safetensors")
        NATIVE[how](root / "link" / "w.safetensors")
    assert rec.files == {".weights/w.safetensors", "link/w.safetensors"} and rec.incomplete is None


def test_the_recorders_own_imports_are_no_recorded_distribution():
    """inotify_simple is imported by the recorder as the block starts, not by the model: an upgrade of it must
    not make every shipped target stale (every manifest listed it)."""
    import sys

    import inotify_simple  # noqa: F401  (as the recorder does)

    from neuron_build.project.reads import imported_distributions

    before = [m for m in sys.modules if m.split(".")[0] not in ("inotify_simple", "pytest")]
    got = imported_distributions(before)
    assert "pytest" in got and "inotify-simple" not in got


def test_another_virtualenv_in_the_project_is_not_watched(tmp_path):
    """A hidden folder is watched now, but a virtualenv kept in the project (``.venv-old/``, its
    ``pyvenv.cfg``) holds no inputs: thousands of folders to watch, and installed files."""
    root = tmp_path / "proj"
    (root / ".venv-old" / "lib").mkdir(parents=True)
    (root / ".venv-old" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    _tensors(root / ".venv-old" / "lib" / "w.safetensors", 1.0)
    with ReadRecorder(root) as rec:
        NATIVE["torch.from_file"](root / ".venv-old" / "lib" / "w.safetensors")
    assert rec.files == set() and rec.incomplete is None


def test_without_inotify_the_record_is_incomplete_so_never_a_hit(tmp_path, monkeypatch):
    """A Linux host whose inotify_simple is missing cannot see native reads: the record says so (fail
    closed), and a record marked incomplete never matches at lookup."""
    import builtins

    real_import = builtins.__import__

    def no_inotify(name, *args, **kwargs):
        if name == "inotify_simple":
            raise ImportError("No module named 'inotify_simple'")
        return real_import(name, *args, **kwargs)

    root = tmp_path / "proj"
    (root / "ckpt").mkdir(parents=True)
    _tensors(root / "ckpt" / "w.safetensors", 1.0)
    monkeypatch.setattr(builtins, "__import__", no_inotify)
    with ReadRecorder(root) as rec:
        NATIVE["safetensors load_file"](root / "ckpt" / "w.safetensors")
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert rec.files == set()
    assert rec.incomplete is not None and "inotify_simple is not installed" in rec.incomplete


def test_a_file_the_block_writes_is_no_input(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "in.txt").write_text("x")
    with ReadRecorder(root) as rec:
        (root / "in.txt").read_text()
        (root / "out.log").write_text("a log")
    assert rec.files == {"in.txt"}


#: Folders whose files are never inputs: pip's and setuptools' metadata, bytecode caches, VCS folders.
NEVER = ["demo.egg-info/entry_points.txt", "demo-1.0.dist-info/METADATA", "tinylib/__pycache__/blob.bin",
         ".git/config", ".hg/hgrc", ".svn/entries", ".pytest_cache/v/cache/lastfailed", ".tox/py/log.txt"]


@pytest.mark.parametrize("rel", NEVER + ["artifacts/store-id.json"])
def test_never_an_input(tmp_path, rel):
    """Read by Python and by native code, a file under one of these folders (or the store) is not recorded,
    and a worker's record naming it is dropped from the manifest; a file beside it is (the test can fail)."""
    cfg = write_tiny_project(tmp_path / "proj")
    root = cfg.parent.resolve()
    f = root / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"metadata")
    (root / "data.txt").write_text("an input")
    store = root / "artifacts"
    with ReadRecorder(root, exclude=[store]) as rec:
        f.read_bytes()
        (root / "data.txt").read_text()
        NATIVE["torch.from_file"](f)
    assert rec.files == {"data.txt"}
    keys = Workspace(load_project(cfg)).keys
    got = keys.recorded_inputs("tiny", [rel], {"files": [rel, "data.txt"], "env": [], "dists": []})
    assert list(got["files"]) == ["data.txt"] and got["imports"] == {}


def test_an_untrusted_record_never_leaves_the_project_by_a_relative_name(tmp_path):
    """A relative name never climbs out of the project; a file outside it is named absolutely (or ``~/``)
    and hashed only when it is a regular file in no exempt place (tests/project/test_read_escapes.py)."""
    from neuron_build.project.reads import InputCheck

    (tmp_path / "secret").write_text("s")
    root = tmp_path / "proj"
    root.mkdir()
    check = InputCheck(root, {}, lambda f: "sha-of-" + f.name)
    assert check.stale({"files": {"../secret": "sha-of-secret"}}) == ["recorded read ../secret changed"]
    assert check.stale({"files": {str(tmp_path / "secret"): "sha-of-secret"}}) == []
    assert check.stale({"files": {"/dev/null": "sha-of-null"}}) == ["recorded read /dev/null changed"]
    assert check.stale({"files": "not a table"}) == ["its recorded inputs do not parse"]
    assert check.stale(None) == []
    assert check.stale({"incomplete": "queue overflow"}) == [
        "its build's reads were not fully recorded (queue overflow)"]
    shutil.rmtree(root)


def test_the_worker_never_watches_the_store(tmp_path):
    """The compile request names the store and the state folder as never read, and the recorder the worker
    makes from it watches no folder under them: a store of thousands of folders would exhaust inotify's
    watches, and every record would then be incomplete (every target rebuilt on every build)."""
    cfg = write_tiny_project(tmp_path / "proj")
    b = Builder(Workspace(load_project(cfg)))
    store = (cfg.parent / "artifacts").resolve()
    for i in range(40):
        (store / "cas" / f"{i:02x}").mkdir(parents=True, exist_ok=True)
    t = b.ws.targets[0]
    req = compile_request(b.ws, t, b.ws.key(t), tmp_path / "out", tmp_path / "work")
    assert str(store) in req.never_read and str(b.ws.project.state_dir.resolve()) in req.never_read
    (store / "cas" / "00" / "blob").write_text("x")
    (cfg.parent / "tinylib" / "data.txt").write_text("y")
    with ReadRecorder(req.root, exclude=[Path(p) for p in req.never_read]) as rec:
        (store / "cas" / "00" / "blob").read_text()
        (cfg.parent / "tinylib" / "data.txt").read_text()
    assert rec.files == {"tinylib/data.txt"} and rec.incomplete is None
    watched = {str(p) for p in rec.watched}
    assert not any(w.startswith(str(store)) for w in watched) and str(cfg.parent.resolve()) in watched

