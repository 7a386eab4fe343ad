"""The compile predictor (neuron_build.build.fleet.predict) over ledger records."""

from __future__ import annotations

import math

import pytest

from neuron_build.build.fleet.predict import Predictor, bucket_tokens, total_work
from neuron_build.store.ledger import LedgerRecord

GB = 10**9
K1, K2, K3 = "1" * 64, "2" * 64, "3" * 64


def rec(target, key, t=None, peak=None, event="compile", backend="neuron", status="PASS"):
    return LedgerRecord(target=target, key=key, event=event, status=status, time="2026-11-01T00:00:00+00:00",
                        backend=backend, compile_time_s=t, peak_rss_bytes=peak)


def test_the_same_key_wins_with_its_median_time_and_its_p90_memory():
    recs = [rec("m/b1-s128/bf16/o2", K1, t, p * GB) for t, p in [(100, 10), (120, 12), (110, 11), (90, 9), (500, 40)]]
    recs.append(rec("m/b1-s128/bf16/o2", K2, 9999, 99 * GB))  # another key of the target: not used
    p = Predictor(recs, default_peak_bytes=4 * GB).predict("m/b1-s128/bf16/o2", K1, "neuron")
    assert p.source == "key" and p.seconds == 110
    assert p.peak_bytes == int((12 + 0.6 * (40 - 12)) * GB)  # p90 of 9, 10, 11, 12, 40 (linear)
    assert p.peak_p50_bytes == 11 * GB


def test_the_same_target_under_another_key_when_the_key_is_new():
    p = Predictor([rec("m/b1-s128/bf16/o2", K1, 200.0, 10 * GB)], 4 * GB).predict("m/b1-s128/bf16/o2", K3, "neuron")
    assert p.source == "target" and p.seconds == 200.0
    assert p.peak_bytes == int(10 * GB * 1.2) and p.peak_p50_bytes == 10 * GB  # one record: the margin


def test_another_profile_of_the_bucket_is_scaled_by_the_ratio_seen_where_both_were_built():
    recs = [rec("m/b1-s128/bf16/o1", K1, 100.0, 10 * GB), rec("m/b1-s128/bf16/o2", K2, 300.0, 20 * GB),
            rec("m/b1-s256/bf16/o1", K3, 150.0, 12 * GB)]
    p = Predictor(recs, 4 * GB).predict("m/b1-s256/bf16/o2", "4" * 64, "neuron")
    assert p.source == "bucket"
    assert p.seconds == pytest.approx(450.0) and p.peak_p50_bytes == 24 * GB  # x3 time, x2 memory


def test_a_model_never_built_gets_the_prior_from_bucket_size_and_model_size():
    # time grows as tokens^0.5 and size^1 in the history: the fit finds it
    recs = []
    for model, size in (("a", 1e9), ("b", 4e9), ("c", 16e9)):
        for seq in (128, 512, 2048):
            recs.append(rec(f"{model}/b1-s{seq}/bf16/o2", f"{model}{seq}".ljust(64, "0"),
                            10 * (size / 1e9) * math.sqrt(seq / 128), int(GB * size / 1e9)))
    pred = Predictor(recs, 4 * GB, sizes={"a": 1e9, "b": 4e9, "c": 16e9, "new": 2e9})
    p = pred.predict("new/b1-s512/bf16/o2", K1, "neuron")
    assert p.source == "prior"
    assert p.seconds == pytest.approx(10 * 2 * 2, rel=1e-6)
    assert p.peak_p50_bytes == pytest.approx(2 * GB, rel=1e-6)


def test_nothing_recorded_predicts_no_time_and_the_default_memory():
    recs = [rec("m/b1/fp32/o1", K1, event="cached"), rec("m/b1/fp32/o1", K2, t=None, peak=None)]
    p = Predictor(recs, 4 * GB).predict("m/b1/fp32/o1", K1, "neuron")
    assert (p.seconds, p.peak_bytes, p.source) == (None, 4 * GB, "none")


def test_a_failed_compile_counts_its_time_and_peak():
    recs = [rec("m/b8/fp32/o1", K1, 50.0, 30 * GB, status="KILLED")]
    p = Predictor(recs, 4 * GB).predict("m/b8/fp32/o1", K1, "neuron")
    assert p.seconds == 50.0 and p.peak_p50_bytes == 30 * GB


def test_bucket_tokens_and_total_work():
    assert [bucket_tokens(b) for b in ("b8-s512", "decode-b4", "prefill-b1-s16", "nxdi")] == [4096, 4, 16, 1]
    pred = Predictor([rec("m/b1/fp32/o1", K1, 100.0, GB), rec("m/b2/fp32/o1", K2, 300.0, GB)], GB)
    ps = [pred.predict("m/b1/fp32/o1", K1), pred.predict("m/b2/fp32/o1", K2)]
    assert total_work(ps) == 400.0
    assert total_work([*ps, Predictor([], GB).predict("x/b1/fp32/o1")]) == 600.0  # unknown: the mean


def test_plan_json_carries_the_prediction_from_the_build_before(tmp_path):
    import json

    from tests.helpers.cli import run_cli
    from tests.helpers.projects import write_tiny_project

    cfg = write_tiny_project(tmp_path)
    before = {r["target"]: r for r in json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)["targets"]}
    first = before["other/static/fp32/p1"]
    assert first["predicted_s"] is None and first["predicted_from"] == "none"
    built = run_cli("build", "--json", "other", "-c", str(cfg))
    assert built.returncode == 0, built.stderr
    took = json.loads(built.stdout)["targets"][0]["compile_time_s"]
    rows = {r["target"]: r for r in json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)["targets"]}
    other = rows["other/static/fp32/p1"]
    assert other["predicted_from"] == "key" and other["predicted_s"] == pytest.approx(took, abs=1e-3)
    assert other["predicted_peak_bytes"] > 10 * 2**20  # a process tree with torch in it
    tiny = rows["tiny/b1/fp32/p1"]  # never built: the prior from the one compile recorded
    assert tiny["predicted_from"] == "prior" and tiny["predicted_s"] == pytest.approx(took, rel=1e-6)


def _family(models, buckets, scale):
    """Records of ``models`` (name -> (size, own time factor)) over ``buckets`` (seq lengths): t = 10 s x size/1e9
    x sqrt(seq/128) x the model's factor x ``scale`` of the bucket; memory likewise."""
    out = []
    for model, (size, f) in models.items():
        for seq in buckets:
            t = 10 * (size / 1e9) * math.sqrt(seq / 128) * f * scale.get((model, seq), 1.0)
            out.append(rec(f"{model}/b1-s{seq}/bf16/o2", f"{model}{seq}".ljust(64, "0"), t, int(GB * t)))
    return out


def test_a_model_seen_once_is_predicted_from_its_own_compile_shrunk_toward_the_prior():
    # models differ by a factor (0.5 .. 2) the prior cannot see; buckets of one model scatter little around it
    models = {"a": (1e9, 0.5), "b": (2e9, 2.0), "c": (4e9, 1.0), "d": (8e9, 0.5), "e": (16e9, 2.0)}
    jitter = {("a", 512): 1.1, ("b", 128): 0.9, ("c", 2048): 1.1, ("d", 512): 0.9, ("e", 128): 1.1}
    recs = _family(models, (128, 512, 2048), jitter)
    pred = Predictor(recs, 4 * GB, sizes={**{m: s for m, (s, _) in models.items()}, "new": 2e9})
    before = pred.predict("new/b1-s512/bf16/o2", K1, "neuron")
    assert before.source == "prior"
    # the new model's first compile (its priority graph) runs 3x the prior: the other buckets follow it
    prior_128 = pred.predict("new/b1-s128/bf16/o2", K1, "neuron").seconds
    pred.observe("new/b1-s128/bf16/o2", seconds=3 * prior_128, peak_bytes=int(3 * GB * prior_128))
    after = pred.predict("new/b1-s512/bf16/o2", K1, "neuron")
    assert after.source == "model"
    ratio = after.seconds / before.seconds
    assert 2.0 < ratio < 3.0  # most of the way to 3x (the within-model spread is small), not all of it
    assert after.seconds_p90 > after.seconds and after.peak_bytes > after.peak_p50_bytes
    assert after.peak_p50_bytes == pytest.approx(ratio * before.peak_p50_bytes, rel=1e-6)
    # an observed bucket is predicted by its own record
    assert pred.predict("new/b1-s128/bf16/o2", K1, "neuron").source == "target"
