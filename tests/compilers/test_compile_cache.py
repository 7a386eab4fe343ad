"""Backend compile-cache (torch.compile(backend="inductor") warmed per bucket, caches captured), for real:
build, release, the warm-up gate, pull, a fresh-process `warmup --json` with 0 compiles, and a drifted
bucket list that misses. Plus the TorchNeuron compiler settings (pure)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from neuron_build.compilers.neuron.torchneuron import compiler_env, metric_row
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, shipped_on, write_tiny_project


def cc_project(root: Path) -> Path:
    cfg = write_tiny_project(root, timeout=1800)  # a real Inductor compile, on a shared host
    edit(cfg, 'backend = "torchscript"', 'backend = "compile-cache"')
    edit(cfg, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]')
    edit(cfg, 'profiles = ["p1", "p2"]', 'profiles = ["p1"]')
    edit(cfg, "buckets = { batch = [1, 4] }", "buckets = { batch = [4] }")
    return cfg


#: One compile thread: no pool of compile workers to start (each imports torch) for a one-kernel model;
#: not a graph-changing setting, so not in the key.
ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def cli(cfg: Path, *args: str):
    return run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=ENV)


def test_compile_cache_release_warms_without_compiling(tmp_path):
    cfg = cc_project(tmp_path / "proj")
    r = cli(cfg, "build", "tiny")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = json.loads(cli(cfg, "show", "tiny/b4/fp32/p1", "--json").stdout)
    c = m["compiler"]
    assert (m["backend"], m["hardware_target"], m["metrics"]["status"]) == ("compile-cache", "cpu", "PASS")
    assert c["artifact"] == "compile_cache.bin" and c["loader"] == "torch.compiler.load_cache_artifacts"
    assert c["counters"]["fxgraph_cache_miss"] == 1 and c["counters"]["fxgraph_cache_hit"] == 0
    assert sorted(c["cache"]["artifacts"]) == ["aot_autograd", "inductor"]
    kernels = [f for f in m["files"] if f.startswith("inductor_kernels/")]
    assert kernels and all(f.endswith(".so") for f in kernels) and sorted(kernels) == sorted(c["kernels"])
    assert len(c["graphs"]) == 1 and m["metrics"]["op_count"] == c["graphs"][0]["op_count"] > 0
    assert c["serving"] == {"torch_compile": {"backend": "inductor", "fullgraph": True, "dynamic": False},
                            "env": {}, "device": "cpu", "grad": "no_grad", "factory": "tinylib.tiny:build",
                            "kwargs": {"width": 16}, "dtype": "fp32"}

    rel = json.loads(cli(cfg, "release", "tiny", "--json").stdout)
    # the gate: a fresh process warms the pulled files; --allow-unvalidated only skips validation here
    r = cli(cfg, "promote", "tiny", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "not validated in tests", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    gate = next(g for g in json.loads(r.stdout)["gates"] if g["name"] == "warmup")
    assert gate["passed"] is True and gate["figures"]["checked"] is True
    assert gate["figures"]["buckets"]["b4"]["compiles"] == 0 and gate["figures"]["compiled"] == []

    dest = tmp_path / "serve"
    assert cli(cfg, "pull", "tiny", "--channel", "dev", "--dest", str(dest)).returncode == 0
    r = run_cli("warmup", str(dest), "--json", "--factory-root", str(cfg.parent), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    w = json.loads(r.stdout)
    assert next(iter(w)) == "schema"  # the JSON contract (tests/flows/test_json_schemas.py runs the other commands)
    jsonschema.validate(w, json.loads((REPO / "docs" / "schemas" / "warmup.json").read_text()))
    b = w["buckets"][0]
    assert (b["id"], b["compiles"], b["graph_compiles"], b["cpp_kernel_builds"]) == ("b4", 0, 0, 0)
    assert b["cache_hits"] == 1 and b["counters"]["fxgraph_cache_hit"] == 1
    assert w["installed"]["inductor"] == 1 and w["installed"]["cpp_kernels"] == len(kernels)
    assert b["first_call_s"] > b["steady_call_s"] > 0

    # a bucket list that differs from the built one (batch 2, never built) misses and says so
    drift = tmp_path / "drift"
    shutil.copytree(dest, drift)
    doc = json.loads((drift / "release.json").read_text())
    doc["buckets"][0]["sizes"] = {"batch": 2}
    doc["buckets"][0]["inputs"][0]["shape"] = [2, 16]
    (drift / "release.json").write_text(json.dumps(doc))
    r = run_cli("warmup", str(drift), "--json", "--factory-root", str(cfg.parent), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    b = json.loads(r.stdout)["buckets"][0]
    assert (b["graph_compiles"], b["cache_hits"]) == (1, 0) and b["cpp_kernel_builds"] >= 1
    assert b["compiles"] == 1 + b["cpp_kernel_builds"]


def test_torchneuron_compiler_settings():
    env = compiler_env(["--auto-cast=none", "--lnc=2", "--model-type=transformer", "--optlevel=3"],
                       {"NEURON_CC_FLAGS": "--verbose=info"}, compile_only=False)
    assert env == {"NEURON_CC_FLAGS": "--auto-cast=none --model-type=transformer --verbose=info",
                   "NEURON_COMPILER_OPT_LEVEL": "3", "NEURON_LOGICAL_NC_CONFIG": "2",
                   "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1"}
    assert list(env) == ["NEURON_CC_FLAGS", "NEURON_COMPILER_OPT_LEVEL", "NEURON_LOGICAL_NC_CONFIG",
                         "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"]
    assert compiler_env([], {}, compile_only=True) == {"TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1",
                                                        "TORCH_NEURONX_COMPILE_ONLY": "1"}
    assert metric_row({"graph_name": "g", "node_count": 7, "compile_time_us": 2500000, "cache_hit": False}) == {
        "graph": "g", "node_count": 7, "compile_time_s": 2.5, "cache_hit": False, "error": None}


@pytest.mark.slow
def test_shipped_rmsnorm_and_minilm_on_compile_cache(tmp_path):

    cfg = shipped_on(tmp_path / "a", "compile-cache", one_seq=False)
    a = cfg.parent
    r = subprocess.run([sys.executable, "-m", "neuron_build.cli", "build", "rmsnorm_naive", "minilm"], cwd=a,
                       capture_output=True, text=True, timeout=3600, env={**__import__("os").environ,
                                                                            "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for model in ("rmsnorm_naive", "minilm"):
        rel = json.loads(cli(cfg, "release", model, "--json").stdout)
        assert cli(cfg, "promote", model, rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "not validated in tests").returncode == 0
        dest = tmp_path / f"serve-{model}"
        assert cli(cfg, "pull", model, "--channel", "dev", "--dest", str(dest)).returncode == 0
        w = json.loads(run_cli("warmup", str(dest), "--json", "--factory-root", str(a), cwd=tmp_path).stdout)
        assert [b["compiles"] for b in w["buckets"]] == [0] * len(rel["artifacts"])
        assert all(b["cache_hits"] >= 1 for b in w["buckets"])
