"""The reads the recorder used not to see, through a real build (tiny torchscript models, one compile each):
a new shard a factory's glob matches and a changed file under the user's home make the target missing
instead of ``cached``; a factory that runs a child process is never ``cached`` (its record is incomplete, the
reason names what ran and the fix). In-process cases of every escape: tests/project/test_read_escapes.py."""

from __future__ import annotations

from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.workspace import Workspace

FACTORY = '''
import glob
import os
import subprocess

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Scale(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return x * self.w


def build():
    shards = sorted(glob.glob(os.path.join(ROOT, "shards", "*.txt")))  # a listing: which shards exist
    with open(os.path.expanduser("~/nbw/scale.txt")) as f:  # outside the project, under the user's home
        scale = float(f.read())
    return Scale(torch.full((4,), scale * len(shards)))


def build_child():
    subprocess.run(["true"], check=True)  # what a child process reads is unknown
    return Scale(torch.full((4,), 3.0))
'''
CONFIG = '''[build]
backend = "torchscript"
timeout_s = 600

[profiles.p1]
compiler_args = []

[models.esc]
factory = "escm.f:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 4] }]

[models.child]
factory = "escm.f:build_child"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [2, 4] }]
'''


def states(cfg: Path) -> dict[str, tuple[str, list[str]]]:
    b = Builder(Workspace(load_project(cfg)))
    out = {t.model: (str(b.ws.state(t)), b.ws.changed(t)[0]) for t in b.ws.targets}
    b.ws.keys.save()
    return out


def test_a_new_shard_a_home_file_and_a_child_process_are_never_served_stale(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "nbw").mkdir(parents=True)
    (home / "nbw" / "scale.txt").write_text("2.0")
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "proj"
    (root / "escm").mkdir(parents=True)
    (root / "escm" / "__init__.py").write_text("")
    (root / "escm" / "f.py").write_text(FACTORY)
    (root / "shards").mkdir()
    (root / "shards" / "0.txt").write_text("0")
    cfg = root / "buckets.toml"
    cfg.write_text(CONFIG)

    b = Builder(Workspace(load_project(cfg)))
    outs = [b.build(t) for t in b.ws.targets]
    assert [(o.target, o.ok) for o in outs] == [(t.id, True) for t in b.ws.targets]
    b.ws.keys.save()
    got = states(cfg)
    assert got["esc"] == ("cached", [])
    state, why = got["child"]  # rebuilt by every build, and says why in one line
    assert state == "missing" and len(why) == 1 and "project code ran a child process (true)" in why[0], why
    assert "inputs_from" in why[0] and "always_rebuild" in why[0]

    (root / "shards" / "1.txt").write_text("1")  # a new shard the glob matches: the model has other weights
    assert states(cfg)["esc"] == ("missing", ["recorded listing shards changed"])
    (root / "shards" / "1.txt").unlink()
    assert states(cfg)["esc"] == ("cached", [])

    (home / "nbw" / "scale.txt").write_text("5.0")
    assert states(cfg)["esc"] == ("missing", ["recorded read ~/nbw/scale.txt changed"])
