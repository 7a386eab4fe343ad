"""The release gates (neuron_build.release.gates), one by one with their figures on the tiny project, and fed
with real validation and benchmark results that ``neuron-build validate`` and ``neuron-build bench`` stored."""

from __future__ import annotations

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.release import (
    channel_history,
    channel_pointer,
    promote,
)
from neuron_build.release.gates import bench_result, latency_gate, validation_gate
from neuron_build.workspace import Workspace
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project
from tests.helpers.releases import ACTOR, bench_all, ctx, gate, make, refused, set_release_config, validate_all

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
    b = Builder(Workspace(load_project(cfg)))
    return b, {t: b.ws.key(b.ws.by_id[t]).key for t in (GOOD, BAD)}


def test_validation_gate_on_stored_results(project):
    b, keys = project
    g = validation_gate(b.ws.store, {GOOD: keys[GOOD]}, "cpu")
    assert g.passed and g.message == "1 artifact(s) passed validation on cpu"

    bad = b.ws.store.result(keys[BAD], "validation", "cpu")
    o = bad["outputs"][0]
    assert bad["verdict"] == "fail" and o["tolerance"] == 1e-6 and o["rel_l2_error"] > 1e-4
    g = validation_gate(b.ws.store, keys, "cpu")
    assert not g.passed
    assert g.message == f"failed: {BAD} ({bad['reason']})"
    assert bad["reason"].startswith(f"{BAD}: output0 rel L2 error {o['rel_l2_error']:.1e} > tolerance 1.0e-06")
    assert g.figures == {"passed": 1, "failed": 1, "not_validated": 0}
    # validated on cpu only: a release served from NeuronCores is not validated
    g = validation_gate(b.ws.store, {GOOD: keys[GOOD]}, "neuron")
    assert not g.passed and g.message == f"not validated on neuron: {GOOD}"


def test_latency_gate_on_stored_benchmarks(project):
    b, keys = project
    good, bad = bench_result(b.ws.store, keys[GOOD], "cpu"), bench_result(b.ws.store, keys[BAD], "cpu")
    assert good["iters"] == bad["iters"] == 20 == len(good["samples_ms"])
    assert good["session"] == bad["session"]  # one `bench` command: one session
    # the same artifact as its own baseline: ratio exactly 1, inside its interval
    g = latency_gate(b.ws.store, {GOOD: keys[GOOD]}, {GOOD: keys[GOOD]}, "cpu")
    row = g.figures["buckets"][GOOD]
    assert g.passed and row["ratio"] == 1.0 and row["ratio_low"] <= 1.0 <= row["ratio_high"]
    # the bf16 artifact as a candidate against the fp32 one as baseline, for the same bucket
    g = latency_gate(b.ws.store, {GOOD: keys[BAD]}, {GOOD: keys[GOOD]}, "cpu")
    row = g.figures["buckets"][GOOD]
    assert row["ratio"] == pytest.approx(bad["latency_ms"]["p50"] / good["latency_ms"]["p50"], rel=1e-3)
    assert row["same_session"] is True
    g = latency_gate(b.ws.store, {GOOD: keys[BAD]}, {GOOD: keys[GOOD]}, "cpu", max_ratio=row["ratio_low"] - 0.01)
    assert not g.passed
    assert g.message.startswith(f"{GOOD} median latency is {row['ratio']:.2f}x the baseline's (95% interval")
    # no benchmark on that device kind: not compared, not failed
    g = latency_gate(b.ws.store, {GOOD: keys[GOOD]}, {GOOD: keys[BAD]}, "neuron")
    assert g.passed and g.figures["not_compared"] == {GOOD: "no benchmark of the candidate on this device kind"}


def test_results_sit_beside_the_artifact(project):
    """Through the store's record contract: each artifact holds one validation per device kind and one
    benchmark per device kind and host, each about its own key and target, and none of them changed the
    artifact (its files verify, its key is planned the same)."""
    import socket
    b, keys = project
    for t, key in keys.items():
        val, bench = b.ws.store.results(key, "validation"), b.ws.store.results(key, "bench")
        assert list(val) == ["cpu"] and list(bench) == [f"cpu--{socket.gethostname()}"]
        for rec in (val["cpu"], *bench.values()):
            assert (rec["key"], rec["target"], rec["device_kind"]) == (key, t, "cpu")
        assert b.ws.store.result(key, "validation", "cpu") == val["cpu"]
        assert bench_result(b.ws.store, key, "cpu") == bench[f"cpu--{socket.gethostname()}"]
        assert b.ws.store.results(key, "profile") == {}  # no other kind was stored
        assert b.ws.store.is_complete(key, deep=True) and set(b.ws.store.manifest(key).files) == {"model.pt"}
    assert b.ws.store.result(keys[BAD], "validation", "cpu")["verdict"] == "fail"
    assert b.ws.store.result(keys[GOOD], "validation", "cpu")["verdict"] == "pass"
    again = Builder(Workspace(load_project(b.ws.project.path)))
    assert {t: again.ws.key(again.ws.by_id[t]).key for t in keys} == keys



def test_gate_channel_order(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    e = refused(store, settings, "staging", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    g = gate(e, "channel_order")
    assert g["passed"] is False
    assert g["figures"] == {"to": "staging", "from": r1["id"], "required_from": "dev", "allow_skip": False}
    assert "staging takes releases from dev" in g["message"]
    assert [x["name"] for x in e["gates"] if not x["passed"]] == ["channel_order"]

    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    e = refused(store, settings, "prod", from_channel="dev", allow_unvalidated=True, reason="not validated in tests")
    assert gate(e, "channel_order")["figures"] == {"to": "prod", "from": "dev", "required_from": "staging",
                                                   "allow_skip": False}
    assert "FAIL channel_order: prod takes releases from staging, not from dev (allow_skip = false)" in e["message"]
    # the release id that dev holds may go on to staging
    assert promote(store, settings, "tiny", "staging", release=r1["id"], allow_unvalidated=True, reason="not validated in tests").version == 1

    set_release_config(proj, "allow_skip = true")
    _, _, store, settings = ctx(proj)
    r2 = make(proj, "bf16")
    entry = promote(store, settings, "tiny", "prod", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    assert gate(entry, "channel_order") == {"name": "channel_order", "verdict": "pass", "passed": True,
                                            "message": f"release {r2['id']} -> prod",
                                            "figures": {"to": "prod", "from": r2["id"], "required_from": "staging",
                                                        "allow_skip": True}}


def test_gate_validated(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    e = refused(store, settings, "dev", release=r1["id"])
    g = gate(e, "validated")
    assert g["passed"] is False
    assert g["figures"] == {"passed": 0, "failed": 0, "not_validated": 2, "device_kind": "cpu"}
    assert g["message"] == "not validated on cpu: tiny/b1/fp32/p1, tiny/b4/fp32/p1"

    validate_all(store, r1)
    b4 = next(a for a in r1["artifacts"] if a["bucket_id"] == "b4")
    store.put_result(b4["key"], "validation", "cpu", {"verdict": "fail", "reason": "rel_l2 0.2 > 0.05",
                                                         "device_kind": "cpu", "outputs": []})
    g = gate(refused(store, settings, "dev", release=r1["id"]), "validated")
    assert g["figures"] == {"passed": 1, "failed": 1, "not_validated": 0, "device_kind": "cpu"}
    assert g["message"] == "failed: tiny/b4/fp32/p1 (rel_l2 0.2 > 0.05)"

    # --allow-unvalidated passes it, marked and recorded
    entry = promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="hotfix")
    g = gate(entry, "validated")
    assert g["passed"] is True and g["figures"]["overridden"] is True and g["figures"]["failed"] == 1
    assert entry.allow_unvalidated is True
    assert channel_history(store, "tiny", "dev")[-1]["allow_unvalidated"] is True

    # validated on cpu does not count for a channel served on neuron
    validate_all(store, r1)
    set_release_config(proj, 'channel_device_kind = { staging = "neuron" }')
    _, _, store, settings = ctx(proj)
    g = gate(refused(store, settings, "staging", from_channel="dev"), "validated")
    assert g["figures"] == {"passed": 0, "failed": 0, "not_validated": 2, "device_kind": "neuron"}
    validate_all(store, r1, "neuron")
    assert gate(promote(store, settings, "tiny", "staging", from_channel="dev"), "validated")["figures"] == {
        "passed": 2, "device_kind": "neuron"}


def test_gate_artifact_count(proj):
    set_release_config(proj, "max_artifacts_per_model = 1")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    validate_all(store, r1)
    g = gate(refused(store, settings, "dev", release=r1["id"]), "artifact_count")
    assert g == {"name": "artifact_count", "verdict": "fail", "passed": False, "figures": {"artifacts": 2, "max": 1},
                 "message": "2 artifacts, more than max_artifacts_per_model = 1"}


def test_gate_op_count(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    validate_all(store, r1)
    promote(store, settings, "tiny", "dev", release=r1["id"])
    # one more op in the model: x * 2 + 1 adds an aten::add to every bucket
    (proj.parent / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 2 + 1\n")
    r = run_cli("build", "-c", str(proj), "tiny/*/fp32/p1")
    assert r.returncode == 0, r.stderr
    r3 = make(proj)
    validate_all(store, r3)
    base = {a["bucket_id"]: store.manifest(a["key"]).metrics.op_count for a in r1["artifacts"]}
    cand = {a["bucket_id"]: store.manifest(a["key"]).metrics.op_count for a in r3["artifacts"]}
    assert base == {"b1": 3, "b4": 3} and cand == {"b1": 4, "b4": 4}
    e = refused(store, settings, "dev", release=r3["id"])
    g = gate(e, "op_count")
    assert g["passed"] is False
    assert g["figures"] == {"buckets": {"b1": {"baseline": 3, "candidate": 4, "change": 0.3333},
                                        "b4": {"baseline": 3, "candidate": 4, "change": 0.3333}},
                            "max_regression": 0.1, "not_compared": []}
    assert g["message"] == "b1 op count 4 is 33.3% above the baseline's 3 (allowed 10.0%)"
    assert e["from"] == r1["id"] and e["to"] == r3["id"]
    # a looser threshold lets it through
    set_release_config(proj, "max_op_count_regression = 0.5")
    _, _, store, settings = ctx(proj)
    assert gate(promote(store, settings, "tiny", "dev", release=r3["id"]), "op_count")["passed"] is True


def test_gate_latency(proj):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    validate_all(store, r1)
    validate_all(store, r2)
    bench_all(store, r1, median_ms=2.0)
    bench_all(store, r2, median_ms=3.0)
    promote(store, settings, "tiny", "dev", release=r1["id"])
    g = gate(refused(store, settings, "dev", release=r2["id"]), "latency")
    assert g["passed"] is False and g["verdict"] == "fail"
    rows = g["figures"]["buckets"]
    assert set(rows) == {"b1", "b4"} and g["figures"]["not_compared"] == {}
    assert rows["b1"]["ratio"] == 1.5 and 1.3 < rows["b1"]["ratio_low"] < 1.5 < rows["b1"]["ratio_high"]
    assert g["message"] == (f"b1 median latency is 1.50x the baseline's (95% interval {rows['b1']['ratio_low']:.2f}-"
                            f"{rows['b1']['ratio_high']:.2f}x; allowed 1.30x)")
    bench_all(store, r2, median_ms=2.4)
    g = gate(promote(store, settings, "tiny", "dev", release=r2["id"]), "latency")
    assert g["passed"] is True and g["figures"]["buckets"]["b1"]["ratio"] == 1.2


def test_old_config_name_max_p99_ratio_still_reads(proj):
    set_release_config(proj, "max_p99_ratio = 1.7")
    _, _, _, settings = ctx(proj)
    assert settings.max_latency_ratio == 1.7


def test_gate_compile_time_p95(proj):
    set_release_config(proj, "max_compile_time_p95_s = 0.5")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    validate_all(store, r1)
    times = {a["target"]: store.manifest(a["key"]).metrics.compile_time_s for a in r1["artifacts"]}
    assert min(times.values()) > 0.5  # a compile subprocess takes seconds
    g = gate(refused(store, settings, "dev", release=r1["id"]), "compile_time_p95")
    assert g["passed"] is False
    assert g["figures"] == {"p95_s": max(times.values()), "max_p95_s": 0.5, "compile_times_s": times}
    assert g["message"] == f"compile-time p95 {max(times.values()):.1f} s is above max_compile_time_p95_s = 0.5 s"


def test_every_gate_reported_and_refusals_recorded(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    e = refused(store, settings, "dev", release=r1["id"], reason="try")
    assert [g["name"] for g in e["gates"]] == ["channel_order", "validated", "artifact_count", "op_count",
                                               "latency", "compile_time_p95", "serving_toolchain", "warmup",
                                               "fresh"]
    warm = e["gates"][-2]  # a torchscript release holds compiled models: nothing to warm
    assert (warm["passed"], warm["figures"]) == (True, {"applies": False})
    assert channel_pointer(store, "tiny", "dev") is None
    hist = channel_history(store, "tiny", "dev")
    assert len(hist) == 1
    h = hist[0]
    assert (h["action"], h["from"], h["to"], h["reason"], h["who"], h["version"]) == (
        "refuse", None, r1["id"], "try", ACTOR, 0)
    assert h["gates"] == e["gates"] and h["refused"].startswith(f"promotion of {r1['id']} into tiny/dev refused by 1")
    # promoting what the channel already holds is refused and recorded too
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    e = refused(store, settings, "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    assert e["refused"] == f"tiny/dev already holds {r1['id']} (version 1)"
    assert [h["action"] for h in channel_history(store, "tiny", "dev")] == ["refuse", "promote", "refuse"]

