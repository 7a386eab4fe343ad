"""The first level's last holes: what a factory reads at build time besides imports (a data file it opens, an
environment variable it reads, the version of a distribution it imports) is recorded by the worker and
changes the next plan's key, without being declared in buckets.toml. One real (torchscript) compile."""

from __future__ import annotations

import json
import os
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.project import plan_cache
from neuron_build.project.config import load_project
from neuron_build.store.reads import recorded_reads
from tests.helpers.projects import write_tiny_project

TARGET = "other/static/fp32/p1"
FACTORY = '''\
import os

import gkdep
import torch


def build():
    torch.manual_seed(1)
    with open(os.path.join(os.path.dirname(__file__), "..", "data", "scale.txt")) as f:
        scale = float(f.read())
    width = int(os.getenv("GK_OTHER_WIDTH", "3"))
    return torch.nn.Linear(16, width + gkdep.EXTRA + int(scale) * 0)
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
    b = Builder(load_project(cfg))
    t = b.by_id[TARGET]
    out = (str(b.state(t)), b.changed(t)[0])
    b.keys.save()
    return out


def test_a_data_file_an_environment_variable_and_a_dependency_version_change_the_key(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("GK_OTHER_WIDTH", raising=False)
    cfg = write_tiny_project(tmp_path / "proj")
    (cfg.parent / "tinylib" / "other.py").write_text(FACTORY)
    (cfg.parent / "data").mkdir()
    (cfg.parent / "data" / "scale.txt").write_text("2.0")

    b = Builder(load_project(cfg))
    out = b.build(b.by_id[TARGET])
    b.keys.save()
    assert out.ok and out.compiled
    rec = recorded_reads(b.store, "other")
    assert rec["files"] == ["data/scale.txt"] and rec["env"] == ["GK_OTHER_WIDTH"]
    assert "gkdep" in rec["dists"] and "torch" in rec["dists"] and "neuron-build" not in rec["dists"]
    assert state(cfg) == ("cached", [])  # the published key is the one the next plan computes

    (cfg.parent / "data" / "scale.txt").write_text("3.0")
    assert state(cfg) == ("missing", ["model: reads.files.data/scale.txt"])
    (cfg.parent / "data" / "scale.txt").write_text("2.0")
    assert state(cfg) == ("cached", [])

    monkeypatch.setenv("GK_OTHER_WIDTH", "3")
    assert state(cfg) == ("missing", ["model: reads.env.GK_OTHER_WIDTH"])
    monkeypatch.delenv("GK_OTHER_WIDTH")
    assert state(cfg) == ("cached", [])

    dist(site, "2.0")
    assert state(cfg) == ("missing", ["model: reads.dists.gkdep"])
    details = Builder(load_project(cfg)).key(b.by_id[TARGET]).details["model"]["reads"]
    assert details["dists"]["gkdep"] == "2.0" and details["env"] == {"GK_OTHER_WIDTH": None}


def test_the_plan_cache_is_a_miss_when_the_recorded_reads_differ(tmp_path):
    doc = {"store": "s", "backend": "torchscript", "hardware_target": "cpu", "targets": [], "recorded": {"m": []},
           "reads": {"m": {"files": ["data/a.txt"], "env": [], "dists": ["numpy"]}}}
    plan = plan_cache.Plan(doc)
    assert plan_cache.reads_match(plan, {"m": {"files": ["data/a.txt"], "env": [], "dists": ["numpy"]}})
    assert not plan_cache.reads_match(plan, {"m": {"files": ["data/a.txt"], "env": ["X"], "dists": ["numpy"]}})
    assert plan_cache.reads_match(plan_cache.Plan({**doc, "reads": {}}), {"m": {"files": [], "env": [], "dists": []}})
    assert json.loads(json.dumps(doc))["reads"] == plan.reads
