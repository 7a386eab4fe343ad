"""The plan cache (issue 14, the no-op): reused only while every input of the cached keys is unchanged.

Each test plans a small project the way ``doit build`` does (a :class:`BuildSession` that loads the
config itself), then changes one kind of input and asserts that the cache is not used any more and that
the key computed afresh differs from the cached one, except for a change that is not in the key (a
logging variable), for which the cache stays valid. The last test runs ``doit build`` for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from neuron_build import tasks
from neuron_build.build.doit.noop import cached_plan
from neuron_build.build.doit.session import config_path_setting
from neuron_build.cpu_isa import ISA_ENV, host_cpu_isa
from neuron_build.project import plan_cache
from tests.helpers.cli import REPO

CONFIG = '''
[build]
backend = "torchscript"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.m]
factory = "pkg.model:build"
kwargs = { width = 8 }
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 8] }]
buckets = { batch = [1, 2] }
weights = ["w.bin", "wdir"]
sources = ["kernels/*.txt"]
'''

MODEL = '''
import colorsys  # the standard library's, until a colorsys.py beside buckets.toml shadows it


def build(width=8):
    import torch
    return torch.nn.Linear(width, width)
'''


@pytest.fixture
def proj(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text(MODEL)
    (root / "w.bin").write_bytes(b"\x01" * 64)
    (root / "wdir" / "sub").mkdir(parents=True)
    (root / "wdir" / "sub" / "a.bin").write_bytes(b"\x02" * 32)
    (root / "kernels").mkdir()
    (root / "kernels" / "k1.txt").write_text("kernel one\n")
    cfg = root / "buckets.toml"
    cfg.write_text(CONFIG)
    monkeypatch.setenv("NEURON_BUILD_CONFIG", str(cfg))
    for var in ("PYTORCH_JIT", "TORCH_LOGS"):
        monkeypatch.delenv(var, raising=False)
    time.sleep(0.05)  # past the timestamp granule of the files just written (else the cache is "racy")
    return cfg


def planned_keys() -> dict[str, str]:
    """target id -> key, planned afresh (no plan cache read), writing the plan cache as doit build does."""
    s = tasks.BuildSession()
    assert s.builder is not None  # made first: task_build plans, and writes the cache at its end
    return {t["name"]: t["uptodate"][0][1][1] for t in s.task_build()}


def cached_keys() -> dict[str, str] | None:
    """target id -> key of the plan cache for the configured ``buckets.toml``, as ``doit build`` reads it
    (None: a miss, the build plans afresh)."""
    hit = cached_plan(config_path_setting())
    return None if hit is None else hit[0].keys()


def restore_times(path: Path, st: os.stat_result) -> None:
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_unchanged_inputs_reuse_the_plan(proj):
    keys = planned_keys()
    assert sorted(keys) == ["m/b1/fp32/p1", "m/b2/fp32/p1"]
    assert (proj.parent / ".neuron-build" / plan_cache.PLAN_CACHE).is_file()
    assert cached_keys() == keys


def test_a_session_without_its_own_builder_uses_the_cache_and_makes_no_builder(proj, monkeypatch):
    keys = planned_keys()
    # from now on the config cannot be loaded: a session that parsed it (to make a Builder and compute
    # the keys) fails the test, one that reads its tasks from the plan cache does not notice
    from neuron_build.project import config

    def no_parse(*a, **kw):
        raise AssertionError("the config was parsed although the plan cache holds the plan")
    monkeypatch.setattr(config, "load_project", no_parse)
    s = tasks.BuildSession()
    got = {t["name"]: t["uptodate"][0][1][1] for t in s.task_build()}
    assert got == keys
    assert s.target_ids() == ["m/b1/fp32/p1", "m/b2/fp32/p1"]
    with pytest.raises(AssertionError, match="the config was parsed"):  # the seam is the one the session uses
        _ = s.builder


@pytest.mark.parametrize("change", [
    "config", "source_same_size_and_mtime", "package_init", "new_helper_module", "weights_in_place",
    "weights_folder_new_file", "key_env", "sources_glob_new_file",
])
def test_each_input_change_is_noticed(proj, change, monkeypatch):
    root = proj.parent
    before = planned_keys()
    assert cached_keys() == before
    if change == "config":
        proj.write_text(proj.read_text().replace("width = 8", "width = 9"))
    elif change == "source_same_size_and_mtime":
        f = root / "pkg" / "model.py"
        st = f.stat()
        f.write_text(MODEL.replace("def build(width=8)", "def build(width=7)"))
        restore_times(f, st)
        assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    elif change == "package_init":
        (root / "pkg" / "__init__.py").write_text("SCALE = 2\n")
    elif change == "new_helper_module":
        (root / "colorsys.py").write_text("from math import *  # noqa\n")
    elif change == "weights_in_place":
        f = root / "w.bin"
        st = f.stat()
        with open(f, "r+b") as fh:
            fh.write(b"\x07")
        restore_times(f, st)
    elif change == "weights_folder_new_file":
        (root / "wdir" / "sub" / "b.bin").write_bytes(b"\x03")
    elif change == "key_env":
        monkeypatch.setenv("PYTORCH_JIT", "0")
    elif change == "sources_glob_new_file":
        (root / "kernels" / "k2.txt").write_text("kernel two\n")
    assert cached_keys() is None, f"the plan cache missed a change of kind {change!r}"
    after = planned_keys()
    assert set(after) == set(before)
    assert all(after[t] != before[t] for t in before), change
    time.sleep(0.05)
    planned_keys()
    assert cached_keys() == after  # and the next plan caches the new keys


def test_a_logging_variable_keeps_the_plan(proj, monkeypatch):
    keys = planned_keys()
    monkeypatch.setenv("TORCH_LOGS", "+dynamo")
    assert cached_keys() == keys


def test_an_installed_package_invalidates_the_plan(proj, tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    time.sleep(0.05)
    keys = planned_keys()
    assert cached_keys() == keys
    (site / "newpkg-1.0.dist-info").mkdir()  # what pip install leaves in a sys.path folder
    assert cached_keys() is None


CODE_PROBE = r'''
import os, sys, time
from pathlib import Path
import neuron_build
from neuron_build import tasks
from neuron_build.build.doit.noop import cached_plan
from neuron_build.project import plan_cache
assert neuron_build.__file__ == sys.argv[2], neuron_build.__file__  # the copy, not the checkout
cfg = Path(os.environ["NEURON_BUILD_CONFIG"])
list(tasks.BuildSession().task_build())
print("planned", cached_plan(str(cfg)) is not None)
keys = Path(sys.argv[1])
time.sleep(0.05)
keys.write_text(keys.read_text() + "# an edit of neuron-build's own key code\n")
print("edited", cached_plan(str(cfg)) is not None, plan_cache.load(cfg.parent / ".neuron-build", cfg.resolve(),
                                                                  cfg.read_bytes())[1])
'''


def test_a_changed_neuron_build_module_invalidates_the_plan(proj, tmp_path):
    """neuron-build's own code is an input of every key: a copy of the package, planned with, then edited."""
    import shutil
    site = tmp_path / "site"
    shutil.copytree(REPO / "neuron_build", site / "neuron_build", ignore=shutil.ignore_patterns("__pycache__"))
    time.sleep(0.05)  # past the timestamp granule of the copied files
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}")
    out = subprocess.run([sys.executable, "-c", CODE_PROBE, str(site / "neuron_build" / "project" / "keys.py"),
                          str(site / "neuron_build" / "__init__.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["planned True", "edited False neuron-build changed"]


def test_a_racy_input_is_never_cached(proj):
    f = proj.parent / "pkg" / "model.py"
    future = time.time_ns() + 5 * 10**9
    os.utime(f, ns=(future, future))  # an input stamped after the cache is written: could change unseen
    planned_keys()
    assert not (proj.parent / ".neuron-build" / plan_cache.PLAN_CACHE).exists()
    assert cached_keys() is None


def test_a_corrupt_cache_is_a_miss(proj):
    planned_keys()
    (proj.parent / ".neuron-build" / plan_cache.PLAN_CACHE).write_text("{not json")
    assert cached_keys() is None
    keys = planned_keys()
    assert cached_keys() == keys and sorted(keys) == ["m/b1/fp32/p1", "m/b2/fp32/p1"]  # the next plan rewrote it


PROBE = r'''
import sys
from doit.doit_cmd import DoitMain
from doit.cmd_base import DodoTaskLoader
rc = DoitMain(DodoTaskLoader()).run(sys.argv[1:])
print("PROBE", rc, "pydantic" in sys.modules, "torch" in sys.modules, file=sys.stderr)
'''


def test_doit_noop_build_from_the_cache_and_a_rebuild_after_an_edit(tmp_path):
    root = tmp_path / "p"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "__init__.py").write_text("")
    (root / "lib" / "lin.py").write_text("import torch\n\n\ndef build():\n    return torch.nn.Linear(4, 4)\n")
    (root / "buckets.toml").write_text(textwrap.dedent('''
        [build]
        backend = "torchscript"
        [profiles.p1]
        compiler_args = ["--optlevel=1"]
        [models.lin]
        factory = "lib.lin:build"
        dtypes = ["fp32"]
        profiles = ["p1"]
        inputs = [{ name = "x", shape = [2, 4] }]
    '''))
    (root / "dodo.py").write_text("from neuron_build.tasks import *  # noqa\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("NEURON_BUILD_CONFIG", None)

    def doit() -> tuple[int, bool, bool, str]:
        p = subprocess.run([sys.executable, "-c", PROBE, "build"], cwd=root, env=env, capture_output=True,
                           text=True, timeout=600)
        line = [ln for ln in p.stderr.splitlines() if ln.startswith("PROBE")]
        assert line, p.stderr[-2000:]
        _, rc, pyd, torch_ = line[-1].split()
        return int(rc), pyd == "True", torch_ == "True", p.stdout

    rc, _, _, out = doit()
    assert rc == 0 and ".  build:lin/static/fp32/p1" in out
    time.sleep(0.05)
    rc, pydantic_imported, torch_imported, out = doit()  # plans (the first run's cache may be racy)
    assert rc == 0 and "-- build:lin/static/fp32/p1" in out
    rc, pydantic_imported, torch_imported, out = doit()
    assert (rc, pydantic_imported, torch_imported) == (0, False, False)
    assert "-- build:lin/static/fp32/p1" in out
    ledger = [json.loads(f.read_text()) for f in sorted((root / "artifacts" / "ledger").rglob("*.json"))]
    hits = [r for doc in ledger for r in doc.get("records", [doc]) if r.get("event") == "cached"]
    assert len(hits) >= 2 and hits[-1]["target"] == "lin/static/fp32/p1" and hits[-1]["executor"] == "LocalExecutor"

    (root / "lib" / "lin.py").write_text("import torch\n\n\ndef build():\n    return torch.nn.Linear(4, 5)\n")
    rc, _, _, out = doit()
    assert rc == 0 and ".  build:lin/static/fp32/p1" in out  # the edit is noticed: compiled again


def test_an_hf_model_folder_change_is_noticed(tmp_path, monkeypatch):
    root = tmp_path / "hfproj"
    (root / "bert").mkdir(parents=True)
    (root / "bert" / "config.json").write_text('{"model_type": "bert", "hidden_size": 32}\n')
    (root / "bert" / "model.safetensors").write_bytes(b"\x00" * 128)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent('''
        [build]
        backend = "torchscript"
        [profiles.p1]
        compiler_args = ["--optlevel=1"]
        [models.enc]
        hf = "bert"
        dtypes = ["fp32"]
        profiles = ["p1"]
        inputs = [{ name = "input_ids", shape = [1, 8], dtype = "int64", range = [0, 100] }]
    '''))
    monkeypatch.setenv("NEURON_BUILD_CONFIG", str(cfg))
    time.sleep(0.05)
    before = planned_keys()
    assert cached_keys() == before
    f = root / "bert" / "config.json"
    st = f.stat()
    f.write_text('{"model_type": "bert", "hidden_size": 64}\n')  # same size, mtime put back
    restore_times(f, st)
    assert cached_keys() is None
    after = planned_keys()
    assert after["enc/static/fp32/p1"] != before["enc/static/fp32/p1"]
    time.sleep(0.05)
    planned_keys()
    (root / "bert" / "generation_config.json").write_text("{}\n")  # a new file from_pretrained reads
    assert cached_keys() is None


def test_the_plan_cache_notices_another_isa(proj, monkeypatch):
    from neuron_build.project import plan_cache

    monkeypatch.delenv(ISA_ENV, raising=False)
    keys = planned_keys()
    assert cached_keys() == keys
    monkeypatch.setenv(ISA_ENV, "AVX2" if host_cpu_isa({}) != "AVX2" else "AVX512")
    assert cached_keys() is None
    plan, why = plan_cache.load(proj.parent / ".neuron-build", proj.resolve(), proj.read_bytes())
    assert plan is None and why == "the host's CPU ISA changed"

