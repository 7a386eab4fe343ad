"""The shipped matrix built with backend = "neuron" under the test double, with `doit build` as the README
says (slow: the shipped models are real; minilm is trimmed to one bucket and one dtype)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.fakes.env import neuron_env
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, shipped_on

CC_VERSION = "2.30.4217.0+5e1f0c2a"


@pytest.mark.slow
def test_shipped_matrix_on_neuron(tmp_path):
    cfg = shipped_on(tmp_path / "a", "neuron")
    a = cfg.parent
    edit(cfg, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=1"]\ntp_degree = 2')
    calls = tmp_path / "calls.jsonl"
    # has_device: the double's neuronx-distributed needs a "NeuronCore" for the TP profile
    env = neuron_env("neuron_sdk", base=dict(os.environ, PYTHONPATH=str(REPO)), calls=calls,
                     log_format="summary", has_device=True)

    def doit(*args):
        return subprocess.run([sys.executable, "-m", "doit", *args], cwd=a, env=env, capture_output=True,
                              text=True, timeout=1500)

    r = doit("build")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(run_cli("ls", "--json", "-c", str(cfg), env=env).stdout)["artifacts"]
    expected = {"ffn/b1-s128/bf16/o2", "ffn/b1-s512/bf16/o2", "rmsnorm_naive/static/bf16/o1",
                "rmsnorm_fused/static/bf16/o1", "minilm/b8-s32/fp32/o2"}
    assert {row["target"] for row in rows} == expected
    n_calls = len(calls.read_text().splitlines())
    assert n_calls == 3 + 2 * 2  # ffn x2, minilm x1, two rmsnorm targets x 2 TP ranks
    for row in rows:
        m = json.loads(run_cli("show", row["key"], "--json", "-c", str(cfg), env=env).stdout)
        mt, c = m["metrics"], m["compiler"]
        assert (m["backend"], mt["status"], mt["compiler_status"]) == ("neuron", "PASS", "PASS")
        assert mt["op_count"] > 0 and mt["op_count_source"] == "neuronx-cc log", m["target"]
        assert mt["compile_time_s"] > mt["compiler_compile_time_s"] >= 0
        assert m["toolchain"]["neuronx-cc"] == m["toolchain"]["neuronx-cc --version"] == CC_VERSION
        tp = 2 if m["profile"] == "o1" else 1
        assert c["tp_degree"] == tp
        neffs = ["model.neff"] if tp == 1 else ["tp_0.neff", "tp_1.neff"]
        assert sorted(c["neff"]) == neffs
        for name in neffs:
            h = c["neff"][name]
            assert h["build_version"] == CC_VERSION and h["neff_version_major"] == 2
            assert h["data_size"] + 1024 == h["file_size"] == m["files"][name]["size"]
        logs = ["compile.log"] if tp == 1 else ["tp_0.compile.log", "tp_1.compile.log"]
        assert sorted(c["logs"]) == logs and all(c["logs"][n]["status"] == "PASS" for n in logs)
    minilm = next(r for r in rows if r["target"].startswith("minilm/"))
    assert minilm["artifact_bytes"] > 80 * 2**20  # the real weights, in the .pt and inlined in the NEFF

    # a second build compiles nothing
    r = doit("build")
    assert r.returncode == 0
    assert ".  build:" not in r.stdout and r.stdout.count("-- build:") == len(expected)
    assert len(calls.read_text().splitlines()) == n_calls
