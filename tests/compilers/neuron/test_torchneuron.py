"""Backend torchneuron (TorchNeuron's torch.compile(backend="neuron")) under the native test double
(tests/fakes/torchneuron_sdk): build, manifest, failures, release, pull, fresh-process warm-up, the warm-up
gate, bench --profile and doctor. Every command runs as a user runs it, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.env import neuron_env
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, shipped_on, write_tiny_project

TNX_VERSION = "2.13.3.4217"


def tn_project(root: Path, buckets: str = "[1, 4]") -> Path:
    cfg = write_tiny_project(root)
    edit(cfg, 'backend = "torchscript"', 'backend = "torchneuron"\ntarget = "trn2"')
    edit(cfg, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]')
    edit(cfg, 'profiles = ["p1", "p2"]', 'profiles = ["p1"]')
    edit(cfg, "buckets = { batch = [1, 4] }", f"buckets = {{ batch = {buckets} }}")
    cfg.write_text(cfg.read_text() + '\n[release]\nserving_device_kind = "neuron"\n')
    return cfg


def env_for(variant: str = "torchneuron_sdk", **switches) -> dict:
    return neuron_env(variant, base=dict(os.environ, PYTHONPATH=str(REPO)), **switches)


def cli(cfg: Path, env: dict, *args: str):
    return run_cli(*args, "-c", str(cfg), env=env, cwd=cfg.parent)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tn")
    cfg = tn_project(root / "proj")
    calls = root / "calls.jsonl"
    env = env_for(torchneuron_calls=calls)
    r = cli(cfg, env, "build", "tiny")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return cfg, env, calls


def test_build_manifest_carries_neffs_and_graph_metrics(built):
    cfg, env, calls = built
    rows = json.loads(cli(cfg, env, "ls", "--json").stdout)["artifacts"]
    assert sorted(r["target"] for r in rows) == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1"]
    keys = set()
    for row in rows:
        m = json.loads(cli(cfg, env, "show", row["key"], "--json").stdout)
        c, mt = m["compiler"], m["metrics"]
        assert (m["backend"], m["hardware_target"], mt["status"]) == ("torchneuron", "trn2", "PASS")
        assert m["toolchain"]["torch-neuronx"] == TNX_VERSION
        neffs = [f for f in m["files"] if f.endswith(".neff")]
        assert len(neffs) == 1 and neffs[0].startswith("neff_cache/")
        key = Path(neffs[0]).stem
        assert neffs[0] == f"neff_cache/{key[:2]}/{key[2:4]}/{key}.neff"
        keys.add(key)
        h = c["neff"][neffs[0]]
        assert (h["header_size"], h["neff_version_major"], h["lnc_size"]) == (1024, 2, 2)
        assert h["data_size"] + 1024 == h["file_size"] == m["files"][neffs[0]]["size"]
        assert "compile_cache.bin" in m["files"] and c["cache"]["artifacts"]["neuron_neff"] == [key]
        graphs = c["graphs"]
        assert len(graphs) == 1 and graphs[0]["node_count"] > 2 and graphs[0]["cache_hit"] is False
        assert graphs[0]["error"] is None
        assert mt["op_count"] == graphs[0]["node_count"]
        assert mt["op_count_source"] == "torch_neuronx.get_dynamo_metrics node count"
        assert mt["graph_count"] == 1 and mt["neff_count"] == 1
        # profile p1 = ["--optlevel=1"]: the opt level goes to its own variable, no other flags
        assert c["env"] == {"NEURON_COMPILER_OPT_LEVEL": "1", "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1",
                            "TORCH_NEURONX_COMPILE_ONLY": "1"}
        assert c["compile_only"] is True and c["serving"]["device"] == "neuron"
        assert c["serving"]["torch_compile"] == {"backend": "neuron", "fullgraph": True, "dynamic": False}
        assert "TORCH_NEURONX_COMPILE_ONLY" not in c["serving"]["env"]
    assert len(keys) == 2  # one graph per bucket shape
    assert [json.loads(ln)["hit"] for ln in calls.read_text().splitlines()] == [False, False]


def test_second_build_compiles_nothing(built):
    cfg, env, calls = built
    n = len(calls.read_text().splitlines())
    r = cli(cfg, env, "build", "tiny")
    assert r.returncode == 0 and "0 built, 2 cached" in r.stdout + r.stderr, r.stdout + r.stderr
    assert len(calls.read_text().splitlines()) == n


def test_release_gate_pull_and_fresh_warmup(built, tmp_path):
    cfg, env, _calls = built
    rel = json.loads(cli(cfg, env, "release", "tiny", "--json").stdout)
    assert rel["runtime"]["serving"]["factory"] == "tinylib.tiny:build"
    r = cli(cfg, env, "promote", "tiny", rel["id"], "--to", "dev", "--json")
    assert r.returncode == 3, r.stdout + r.stderr  # refused by a gate
    refused = next(g for g in json.loads(r.stdout)["gates"] if g["name"] == "warmup")
    assert (refused["verdict"], refused["message"]) == ("fail", "not checked: no NeuronCore here")
    hist = json.loads(cli(cfg, env, "history", "tiny", "--channel", "dev", "--json").stdout)["history"]
    gate = next(g for g in hist[-1]["gates"] if g["name"] == "warmup")
    assert gate["passed"] is False and gate["message"] == "not checked: no NeuronCore here"
    assert gate["figures"]["checked"] is False
    r = cli(cfg, env, "promote", "tiny", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "not validated in tests", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    gate = next(g for g in json.loads(r.stdout)["gates"] if g["name"] == "warmup")
    assert gate["passed"] is True and gate["figures"]["overridden"] is True

    dest = tmp_path / "serve"
    assert cli(cfg, env, "pull", "tiny", "--channel", "dev", "--dest", str(dest)).returncode == 0
    r = cli(cfg, env, "warmup", str(dest), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    w = json.loads(r.stdout)
    assert w["backend"] == "torchneuron" and w["device_note"] == "no NeuronCore here: ran on CPU tensors"
    assert w["installed"] == {"neuron_neff": 2}
    assert [(b["id"], b["compiles"], b["cache_hits"]) for b in w["buckets"]] == [("b1", 0, 1), ("b4", 0, 1)]
    assert all(b["first_call_s"] > 0 and b["steady_call_s"] > 0 for b in w["buckets"])
    assert w["env"] == {"NEURON_COMPILER_OPT_LEVEL": "1", "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1"}

    # a drifted flag (the literal NEURON_CC_FLAGS is in TorchNeuron's cache key) misses in every bucket
    drift = tmp_path / "drift"
    shutil.copytree(dest, drift)
    doc = json.loads((drift / "release.json").read_text())
    doc["serving"]["env"]["NEURON_CC_FLAGS"] = "--model-type=transformer"
    (drift / "release.json").write_text(json.dumps(doc))
    r = cli(cfg, env, "warmup", str(drift), "--json")
    assert r.returncode == 1
    w = json.loads(r.stdout)
    assert [(b["compiles"], b["cache_hits"]) for b in w["buckets"]] == [(1, 0), (1, 0)]
    assert w["zero_compiles"] is False and w["compiles_total"] == 2


def test_graph_break_and_compile_failure(tmp_path):
    cfg = tn_project(tmp_path / "proj", buckets="[1]")
    r = cli(cfg, env_for(graph_break=True), "build", "tiny")
    assert r.returncode == 1
    assert "FAILED tiny/b1/fp32/p1: ERROR: graph break: Call to `torch._dynamo.graph_break()`" in r.stdout
    f = json.loads(cli(cfg, env_for(), "show", "tiny/b1/fp32/p1", "--json").stdout)
    assert f["status"] == "ERROR" and f["details"]["graph_break"].startswith("Call to `torch._dynamo.graph_break()`")

    r = cli(cfg, env_for(torchneuron_fail="compile"), "build", "tiny")
    assert r.returncode == 1
    line = next(ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("FAILED"))
    assert line.startswith("FAILED tiny/b1/fp32/p1: ERROR: compile failed: RuntimeError: neuronx-cc failed with 1: "
                           "[NCC_EUOC002]"), line
    f = json.loads(cli(cfg, env_for(), "show", "tiny/b1/fp32/p1", "--json").stdout)
    assert f["status"] == "ERROR" and f["details"]["graphs"][0]["error"].startswith("neuronx-cc failed with 1")


def test_xla_torch_neuronx_is_refused_by_api(tmp_path):
    cfg = tn_project(tmp_path / "proj", buckets="[1]")
    r = cli(cfg, env_for("neuron_sdk"), "build", "tiny")
    assert r.returncode == 1
    assert ("TOOLCHAIN_MISSING: the installed torch-neuronx 2.13.0.2.30.4217 is the XLA library (it has "
            "torch_neuronx.trace") in r.stdout


def test_doctor_and_auto_tell_the_products_apart_by_api(built, tmp_path):
    native = json.loads(run_cli("doctor", "--json", env=env_for(), cwd=tmp_path).stdout)
    assert native["torch_neuronx_api"] == "native"
    assert native["auto_backend_by_target"] == {"trn1": "inductor", "trn2": "torchneuron", "trn3": "torchneuron"}
    xla = json.loads(run_cli("doctor", "--json", env=env_for("neuron_sdk"), cwd=tmp_path).stdout)
    assert xla["torch_neuronx_api"] == "xla"
    assert xla["auto_backend_by_target"] == {"trn1": "neuron", "trn2": "neuron", "trn3": "neuron"}
    # auto on trn2 with the native package: the keys of backend = "torchneuron", so the built targets are cached
    cfg, env, _ = built
    auto = cfg.parent / "auto.toml"
    auto.write_text(cfg.read_text().replace('backend = "torchneuron"', 'backend = "auto"'))
    plan = {t["target"]: t["state"] for t in json.loads(cli(auto, env, "plan", "--json").stdout)["targets"]}
    assert plan["tiny/b1/fp32/p1"] == plan["tiny/b4/fp32/p1"] == "cached"


def test_bench_profile_writes_paired_files(built, tmp_path):
    cfg, env, _ = built
    out = tmp_path / "prof"
    r = cli(cfg, env, "bench", "tiny/b4/fp32/p1", "--profile", str(out), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    runs = list(out.iterdir())
    assert len(runs) == 1
    run = json.loads((runs[0] / "run.json").read_text())
    assert run["device_note"].startswith("no NeuronCore here")
    # PrivateUse1, which TorchNeuron renames "neuron"
    assert run["sort_by"] == "self_device_time_total" and run["activities"] == ["CPU", "NEURON"]
    assert run["neuron_config"]["correlate_device_time"] is True
    pairs = run["device_files"]
    assert len(pairs) == 1 and pairs[0]["neff"] == f"{pairs[0]['hash']}.neff"
    assert pairs[0]["ntff"] == f"{pairs[0]['hash']}.ntff"
    names = sorted(p.name for p in runs[0].iterdir())
    assert names == sorted(["run.json", "top_ops.txt", "trace.json", pairs[0]["neff"], pairs[0]["ntff"]])
    neff = (runs[0] / pairs[0]["neff"]).read_bytes()
    assert int.from_bytes(neff[8:16], "little") == 1024 and (runs[0] / pairs[0]["ntff"]).read_bytes()[:4] == b"NTFF"
    assert run["wall_clock_ms"]["p50"] > 0 and len(run["profiled_step_ms"]) == 4
    json.loads((runs[0] / "trace.json").read_text())


@pytest.mark.slow
def test_shipped_matrix_on_torchneuron(tmp_path):

    cfg = shipped_on(tmp_path / "a", "torchneuron")
    a = cfg.parent
    edit(cfg, 'target = "trn1"', 'target = "trn2"')
    calls = tmp_path / "calls.jsonl"
    env = env_for(torchneuron_calls=calls)

    def doit(*args):
        return subprocess.run([sys.executable, "-m", "doit", *args], cwd=a, env=env, capture_output=True,
                              text=True, timeout=1500)

    r = doit("build")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(run_cli("ls", "--json", "-c", str(cfg), env=env).stdout)["artifacts"]
    assert len(rows) == 5
    for row in rows:
        m = json.loads(run_cli("show", row["key"], "--json", "-c", str(cfg), env=env).stdout)
        assert m["backend"] == "torchneuron" and m["metrics"]["op_count"] > 0
        assert m["compiler"]["neff"] and all(h["neff_version_major"] == 2 for h in m["compiler"]["neff"].values())
        assert m["compiler"]["graphs"] and all(g["node_count"] > 0 for g in m["compiler"]["graphs"])
    n = len(calls.read_text().splitlines())
    r = doit("build")
    assert r.returncode == 0 and ".  build:" not in r.stdout
    assert len(calls.read_text().splitlines()) == n
