"""The release gates (neuron_build.release.gates) fed with real validation and benchmark results that
``neuron-build validate`` and ``neuron-build bench`` stored (tiny torchscript project)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli, write_tiny_project

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.release.gates import bench_result, latency_gate, validation_gate

GOOD, BAD = "tiny/b4/fp32/p1", "tiny/b4/bf16/p1"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    # a bf16 tolerance far below bf16 rounding: tiny/b4/bf16/p1 really fails validation
    cfg = write_tiny_project(tmp_path_factory.mktemp("gates") / "proj")
    cfg.write_text(cfg.read_text().replace('buckets = { batch = [1, 4] }',
                                           'buckets = { batch = [1, 4] }\ntolerance = { bf16 = 1e-6 }'))
    r = run_cli("build", "-c", str(cfg), "-n", "2", GOOD, BAD)
    assert r.returncode == 0, r.stdout + r.stderr
    v = run_cli("validate", "-c", str(cfg), GOOD, BAD)
    assert v.returncode == 1  # BAD fails
    bn = run_cli("bench", "-c", str(cfg), "--iters", "20", "--warmup", "2", GOOD, BAD)
    assert bn.returncode == 0, bn.stderr
    b = Builder(load_project(cfg))
    return b, {t: b.key(b.by_id[t]).key for t in (GOOD, BAD)}


def test_validation_gate_on_stored_results(project):
    b, keys = project
    g = validation_gate(b.store, {GOOD: keys[GOOD]}, "cpu")
    assert g.passed and g.message == "1 artifact(s) passed validation on cpu"

    bad = b.store.result(keys[BAD], "validation", "cpu")
    o = bad["outputs"][0]
    assert bad["verdict"] == "fail" and o["tolerance"] == 1e-6 and o["rel_l2_error"] > 1e-4
    g = validation_gate(b.store, keys, "cpu")
    assert not g.passed
    assert g.message == f"failed: {BAD} ({bad['reason']})"
    assert bad["reason"].startswith(f"{BAD}: output0 rel L2 error {o['rel_l2_error']:.1e} > tolerance 1.0e-06")
    assert g.figures == {"passed": 1, "failed": 1, "not_validated": 0}
    # validated on cpu only: a release served from NeuronCores is not validated
    g = validation_gate(b.store, {GOOD: keys[GOOD]}, "neuron")
    assert not g.passed and g.message == f"not validated on neuron: {GOOD}"


def test_latency_gate_on_stored_benchmarks(project):
    b, keys = project
    good, bad = bench_result(b.store, keys[GOOD], "cpu"), bench_result(b.store, keys[BAD], "cpu")
    assert good["iters"] == bad["iters"] == 20 == len(good["samples_ms"])
    assert good["session"] == bad["session"]  # one `bench` command: one session
    # the same artifact as its own baseline: ratio exactly 1, inside its interval
    g = latency_gate(b.store, {GOOD: keys[GOOD]}, {GOOD: keys[GOOD]}, "cpu")
    row = g.figures["buckets"][GOOD]
    assert g.passed and row["ratio"] == 1.0 and row["ratio_low"] <= 1.0 <= row["ratio_high"]
    # the bf16 artifact as a candidate against the fp32 one as baseline, for the same bucket
    g = latency_gate(b.store, {GOOD: keys[BAD]}, {GOOD: keys[GOOD]}, "cpu")
    row = g.figures["buckets"][GOOD]
    assert row["ratio"] == pytest.approx(bad["latency_ms"]["p50"] / good["latency_ms"]["p50"], rel=1e-3)
    assert row["same_session"] is True
    g = latency_gate(b.store, {GOOD: keys[BAD]}, {GOOD: keys[GOOD]}, "cpu", max_ratio=row["ratio_low"] - 0.01)
    assert not g.passed
    assert g.message.startswith(f"{GOOD} median latency is {row['ratio']:.2f}x the baseline's (95% interval")
    # no benchmark on that device kind: not compared, not failed
    g = latency_gate(b.store, {GOOD: keys[GOOD]}, {GOOD: keys[BAD]}, "neuron")
    assert g.passed and g.figures["not_compared"] == {GOOD: "no benchmark of the candidate on this device kind"}


def test_results_sit_beside_the_artifact(project):
    b, keys = project
    base = b.store.root / "results" / keys[GOOD]
    assert sorted(p.relative_to(base).as_posix() for p in base.rglob("*.json")) == sorted(
        ["validation/cpu.json", f"bench/cpu--{bench_result(b.store, keys[GOOD], 'cpu')['host']}.json"])
    assert json.loads((base / "validation" / "cpu.json").read_text())["key"] == keys[GOOD]
