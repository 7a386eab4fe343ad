"""Benchmarks and profiler traces on the tiny torchscript project: structure and invariants, never
absolute times."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.evaluate.bench import SCHEDULE, latency_stats, percentile, run_dir_name, time_calls, time_interleaved
from neuron_build.project.config import load_project
from neuron_build.release.gates import bench_result
from neuron_build.workspace import Workspace
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import manifest_file, rewrite_manifest, write_tiny_project

TARGETS = ("tiny/b4/fp32/p1", "other/static/fp32/p1")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    cfg = write_tiny_project(tmp_path_factory.mktemp("bench") / "proj")
    r = run_cli("build", "-c", str(cfg), "-n", "2", *TARGETS)
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


def _keys(cfg: Path) -> dict[str, str]:
    b = Builder(Workspace(load_project(cfg)))
    return {t: b.ws.key(b.ws.by_id[t]).key for t in TARGETS}


def test_bench_json_structure_and_invariants(built):
    r = run_cli("bench", "-c", str(built), "--iters", "30", "--warmup", "3", "--json", *TARGETS)
    assert r.returncode == 0, r.stderr
    recs = {x["target"]: x for x in json.loads(r.stdout)["records"]}
    assert set(recs) == set(TARGETS)
    keys = _keys(built)
    b = Builder(Workspace(load_project(built)))
    for tid, rec in recs.items():
        assert rec["key"] == keys[tid]
        assert rec["iters"] == 30 and rec["warmup"] == 3
        assert rec["device_kind"] == "cpu" and rec["host"] == socket.gethostname() and rec["sync"] == "none (cpu)"
        assert rec["timing"] == "interleaved with eager"
        for lat in (rec["latency_ms"], rec["eager"]["latency_ms"]):
            assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
            assert lat["min"] <= lat["mean"] <= lat["max"]
        assert rec["throughput_per_s"] == pytest.approx(rec["batch"] * 1000 / rec["latency_ms"]["mean"], rel=1e-4)
        p50, e50 = rec["latency_ms"]["p50"], rec["eager"]["latency_ms"]["p50"]
        # both p50s are stored rounded to 1e-6 ms; the ratio was taken before rounding
        assert rec["speedup_vs_eager"] == pytest.approx(e50 / p50, rel=1e-4 + 1e-6 / min(p50, e50))
        m = b.ws.store.manifest(keys[tid])
        assert rec["op_count"] == m.metrics.op_count and rec["compile_time_s"] == m.metrics.compile_time_s
        # stored for the release gates, per (key, device kind, host)
        stored = b.ws.store.result(keys[tid], "bench", f"cpu--{socket.gethostname()}")
        assert stored == rec
        assert bench_result(b.ws.store, keys[tid], "cpu") == rec
    assert recs["tiny/b4/fp32/p1"]["batch"] == 4  # first dim of the first input
    assert recs["other/static/fp32/p1"]["batch"] == 2


def test_progress_and_table_output(built):
    r = run_cli("bench", "-c", str(built), "--iters", "5", "--warmup", "1", "tiny/b4/fp32/p1")
    assert r.returncode == 0, r.stderr
    assert "benchmarking 1 artifact(s) in one session: warm-up 1, 5 timed rounds, interleaved with eager" in r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["target", "p50", "ms", "p90", "ms", "p99", "ms", "mean", "ms", "samples/s",
                                "eager", "p50", "speedup"]
    row = lines[2].split()
    assert row[0] == "tiny/b4/fp32/p1" and row[-1].endswith("x")
    p50, p90, p99 = map(float, row[1:4])
    assert p50 <= p90 <= p99


def test_compare_prints_one_side_by_side_table(built):
    r = run_cli("bench", "-c", str(built), "--iters", "10", "--warmup", "2", "--compare", *TARGETS)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == list(TARGETS)
    rows = {ln[:16].strip(): ln[16:].split() for ln in lines[2:] if ln.strip() and not ln.startswith("cpu on")}
    for label in ("p50 ms", "p90 ms", "p99 ms", "mean ms", "samples/s", "eager p50 ms", "speedup vs eager",
                  "op count", "compile s", "reference", "rel L2 error", "max abs error", "cosine", "tolerance",
                  "verdict"):
        assert label in rows and len(rows[label]) == 2, label
    b = Builder(Workspace(load_project(built)))
    keys = _keys(built)
    assert rows["op count"] == [str(b.ws.store.manifest(keys[t]).metrics.op_count) for t in TARGETS]
    assert rows["verdict"] == ["pass", "pass"]
    assert rows["reference"] == ["tiny", "other"]
    for i in range(2):
        p50, p90, p99 = (float(rows[k][i]) for k in ("p50 ms", "p90 ms", "p99 ms"))
        assert p50 <= p90 <= p99
        assert float(rows["rel L2 error"][i]) < 1e-5
    # the compare run validated too: its figures are the stored ones
    v = b.ws.store.result(keys[TARGETS[1]], "validation", "cpu")
    assert rows["rel L2 error"][1] == f"{v['outputs'][0]['rel_l2_error']:.1e}"


def test_profile_writes_trace_with_the_models_operators(built, tmp_path):
    out = tmp_path / "prof"
    r = run_cli("bench", "-c", str(built), "--iters", "5", "--warmup", "1", "--profile", str(out), "tiny/b4/fp32/p1")
    assert r.returncode == 0, r.stderr
    key = _keys(built)["tiny/b4/fp32/p1"]
    run_dir = out / run_dir_name("tiny/b4/fp32/p1", key)
    assert run_dir.name == f"tiny_b4_fp32_p1-{key[:12]}"
    assert sorted(p.name for p in out.iterdir()) == [run_dir.name]  # no temporary folder left
    trace = json.loads((run_dir / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    # the tiny model: Linear, relu, * 2 (TorchScript runs them through the dispatcher)
    assert names & {"aten::linear", "aten::addmm"}
    assert "aten::relu" in names and "aten::mul" in names
    assert "artifact tiny/b4/fp32/p1" in names
    # exactly one active step was recorded
    assert sum(1 for n in names if n and n.startswith("ProfilerStep#")) == SCHEDULE["active"]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["key"] == key and run["target"] == "tiny/b4/fp32/p1"
    assert run["iters"] == 5 and run["warmup"] == 1
    assert run["schedule"] == {"wait": 2, "warmup": 1, "active": 1}
    assert run["device"] == "cpu" and run["activities"] == ["CPU"] and run["sort_by"] == "self_cpu_time_total"
    assert run["torch"].startswith("2.") and run["host"] == socket.gethostname()
    top = [o["name"] for o in run["top_ops"]]
    assert any(n in top for n in ("aten::linear", "aten::addmm"))
    assert (run_dir / "top_ops.txt").read_text().count("aten::") >= 2
    assert f"profile of tiny/b4/fp32/p1 (self_cpu_time_total): {run_dir}/trace.json" in r.stdout
    # a second run replaces the folder whole: the trace and run.json always come from one run
    r = run_cli("bench", "-c", str(built), "--iters", "3", "--warmup", "0", "--profile", str(out), "tiny/b4/fp32/p1")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [run_dir.name]
    assert json.loads((run_dir / "run.json").read_text())["iters"] == 3


def test_bench_errors(built, tmp_path):
    r = run_cli("bench", "-c", str(built), "tiny/b1/fp32/p1")
    assert r.returncode == 1 and "NOT BUILT  tiny/b1/fp32/p1" in r.stderr
    r = run_cli("bench", "-c", str(built), "--iters", "0", "other")
    assert r.returncode == 2 and "--iters must be >= 1" in r.stderr
    r = run_cli("bench", "-c", str(built), "--compare", "nosuch")
    assert r.returncode == 2 and "no target matches 'nosuch'" in r.stderr


# --------------------------------------------------------------------------------------------------
def test_time_calls_counts_calls_syncs_and_progress():
    calls, syncs = [], []

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    out = time_calls(lambda *a: calls.append(a), (1, 2), warmup=3, iters=7, sync=lambda: syncs.append(1),
                     progress=bar)
    assert len(out) == 7 and all(x >= 0 for x in out)
    assert len(calls) == 10 and calls[0] == (1, 2)
    assert len(syncs) == 10  # every call, warm-up included, ends with a synchronise
    assert bar.n == 10


def test_percentile_matches_numpy_linear():
    import numpy as np  # in the test extra: a missing install fails here, never skips
    rng = random.Random(4)
    for n in (1, 2, 3, 10, 101):
        xs = sorted(rng.uniform(0, 10) for _ in range(n))
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats_invariants():
    rng = random.Random(7)
    xs = [rng.expovariate(1.0) for _ in range(200)]
    s = latency_stats(xs)
    assert s["min"] <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"]
    assert s["mean"] == pytest.approx(sum(xs) / len(xs))
    assert latency_stats([2.0]) == {"p50": 2.0, "p90": 2.0, "p99": 2.0, "mean": 2.0, "min": 2.0, "max": 2.0,
                                    "std": 0.0}


def test_neuron_artifact_is_skipped_without_a_neuroncore(tmp_path, monkeypatch, capsys):
    """The bench command in this process with the host's NeuronCores hidden (``neuron_devices`` -> []), so the
    test means the same on a host with one."""
    from neuron_build import cli
    from neuron_build.evaluate import validate
    cfg = write_tiny_project(tmp_path / "p")
    assert run_cli("build", "-c", str(cfg), "other").returncode == 0
    b = Builder(Workspace(load_project(cfg)))
    key = b.ws.key(b.ws.by_id["other/static/fp32/p1"]).key
    mf = manifest_file(b.ws.store, key)
    rewrite_manifest(mf, lambda m: m.update(backend="neuron", hardware_target="trn1"))
    monkeypatch.setattr(validate, "neuron_devices", lambda: [])
    assert cli.main(["bench", "-c", str(cfg), "--iters", "3", "other"]) == 0
    err = capsys.readouterr().err
    assert "SKIPPED  other/static/fp32/p1: no NeuronCore here" in err
    assert "1 skipped (this host cannot run them): other/static/fp32/p1" in err
    assert b.ws.store.results(key, "bench") == {}


@pytest.mark.slow
def test_inductor_rmsnorm_pair_validate_compare_profile(tmp_path):
    """The shipped RMSNorm pair compiled with AOTInductor (two real compiles): validation against the
    written-out reference, the side-by-side table and a profiler trace of a .pt2 artifact."""
    import shutil

    root = tmp_path / "p"
    (root / "models").mkdir(parents=True)
    (root / "models" / "__init__.py").write_text("")
    shutil.copy(REPO / "models" / "rmsnorm.py", root / "models" / "rmsnorm.py")
    text = (REPO / "buckets.toml").read_text()
    text = text.replace('backend = "auto"', 'backend = "inductor"')
    text = text[:text.index("[models.ffn]")] + text[text.index("[models.rmsnorm_naive]"):text.index("[models.minilm]")]
    cfg = root / "buckets.toml"
    cfg.write_text(text)
    r = run_cli("build", "-c", str(cfg), "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    v = run_cli("validate", "--json", "-c", str(cfg))
    assert v.returncode == 0, v.stdout + v.stderr
    recs = {x["target"]: x for x in json.loads(v.stdout)["records"]}
    fused = recs["rmsnorm_fused/static/bf16/o1"]
    assert fused["backend"] == "inductor" and fused["reference"]["model"] == "rmsnorm_naive"
    assert 1e-4 < fused["outputs"][0]["rel_l2_error"] < 2e-2  # bf16 output rounding
    c = run_cli("bench", "-c", str(cfg), "--iters", "20", "--warmup", "2", "--profile", str(tmp_path / "prof"),
                "--compare", "rmsnorm_naive", "rmsnorm_fused")
    assert c.returncode == 0, c.stderr
    # the profiles are printed first, then the table
    assert ["rmsnorm_naive/static/bf16/o1", "rmsnorm_fused/static/bf16/o1"] in [ln.split() for ln in c.stdout.splitlines()]
    assert "verdict" in c.stdout and "op count" in c.stdout
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id["rmsnorm_fused/static/bf16/o1"]
    run_dir = tmp_path / "prof" / run_dir_name(t.id, b.ws.key(t).key)
    trace = json.loads((run_dir / "trace.json").read_text())
    assert f"artifact {t.id}" in {e.get("name") for e in trace["traceEvents"]}
    assert json.loads((run_dir / "run.json").read_text())["key"] == b.ws.key(t).key


def test_time_interleaved_alternates_and_counts():
    seq, syncs = [], []

    class Bar:
        n = 0

        def update(self, k):
            self.n += k

    bar = Bar()
    a, b = (lambda *x: seq.append("a")), (lambda *x: seq.append("b"))
    ta, tb = time_interleaved([a, b], (), warmup=2, iters=4, sync=lambda: syncs.append(1), progress=bar)
    assert len(ta) == len(tb) == 4
    assert "".join(seq) == "abab" + "ab" + "ba" + "ab" + "ba"  # warm-up rounds, then the order alternates
    assert len(syncs) == 12 and bar.n == 6


class FakeClock:
    """Seconds that pass only when a benchmarked call runs (``cost`` each)."""

    def __init__(self, cost: float):
        self.now, self.cost = 0.0, cost

    def __call__(self) -> float:
        return self.now

    def call(self, *args) -> None:
        self.now += self.cost


def test_max_time_bounds_the_whole_session_warm_up_included():
    """bench minilm ran 21 min 42 s with --max-time 60: warm-up (50 rounds) and --min-iters (30) came on top
    of the budget. With rounds of 2 s and a 60 s budget the session now ends within one round of 60 s, warm-up
    taking at most a quarter of it, and says so before it runs."""
    from neuron_build.evaluate.timing import TimingSettings, time_rounds

    clock, notes = FakeClock(2.0), []
    times, stopped = time_rounds([clock.call], [()], [lambda: None],
                                 TimingSettings(warmup=50, min_iters=30, max_time_s=60.0), clock=clock,
                                 note=notes.append)
    assert stopped == "time" and 60.0 <= clock.now <= 62.0
    assert len(times[0]) == 30 - 8  # 8 warm-up rounds (16 s, a quarter of 60 s rounded up to a round), then 22
    assert notes[0] == ("one round takes 2 s: at most 60 s in all, warm-up included (--max-time); the budget holds "
                        "about 30 rounds, fewer than warm-up 50 + --min-iters 30: warm-up stops at 25% of it and "
                        "timing at 60 s")
    assert [n for n in notes[1:]] == ["warm-up round 8, 16 of 60 s", "timed round 8, 32 of 60 s",
                                      "timed round 16, 48 of 60 s"]


def test_the_warm_up_rounds_run_are_what_is_recorded():
    """A bench record said ``warmup: 50`` where the budget had cut warm-up to a few rounds (an AOTInductor
    artifact's first calls are slow): the rounds run are reported, for the record's ``warmup``."""
    from neuron_build.evaluate.timing import TimingSettings, time_rounds

    clock, done = FakeClock(2.0), {}
    time_rounds([clock.call], [()], [lambda: None], TimingSettings(warmup=50, min_iters=30, max_time_s=60.0),
                clock=clock, rounds=done)
    assert done == {"warmup": 8}
    clock, done = FakeClock(0.001), {}
    time_rounds([clock.call], [()], [lambda: None], TimingSettings(warmup=5, iters=3), clock=clock, rounds=done)
    assert done == {"warmup": 5}


def test_fixed_iters_say_what_they_will_take_before_timing():
    from neuron_build.evaluate.timing import TimingSettings, time_rounds

    clock, notes = FakeClock(0.5), []
    times, stopped = time_rounds([clock.call, clock.call], [(), ()], [lambda: None] * 2,
                                 TimingSettings(warmup=2, iters=10, max_time_s=1.0), clock=clock, note=notes.append)
    assert stopped == "iters" and [len(t) for t in times] == [10, 10] and clock.now == 12.0
    assert notes == ["one round takes 1 s: 2 warm-up + 10 timed rounds will take about 12 s (--iters is not bounded "
                     "by --max-time)"]
