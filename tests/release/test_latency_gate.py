"""The latency gate measures, not guesses: medians with order-statistic intervals, benchmarks of one
session preferred, like compared with like, a refusal only beyond the interval, waivers only with a reason.

The end-to-end part builds one model (an MLP of about a millisecond per call) with two profiles, so two
releases of identical speed and different keys; benchmarks them together in one session; promotes the
second over the first several times (always passes); then benchmarks it with a sleep added to its forward
(1.5x the baseline's median) and is refused, with the gate's figures on stdout (``--json``) and exit 3.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.cli.bench import bench_selected
from neuron_build.evaluate.bench import BenchResult
from neuron_build.evaluate.timing import TimingSettings
from neuron_build.project.config import load_project
from neuron_build.release import create_release, promote
from neuron_build.release.gates import comparable, latency_gate, pick_pair
from neuron_build.util import median_ci, ratio_ci
from neuron_build.workspace import Workspace
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project

# ---------------------------------------------------------------------------------------------------
# statistics


def test_median_interval_covers_the_true_median_at_its_confidence():
    rng = random.Random(7)
    true_median = 1.0  # lognormal(0, s): median exp(0) = 1
    covered = 0
    trials = 400
    for _ in range(trials):
        xs = [rng.lognormvariate(0, 0.8) for _ in range(61)]
        med, lo, hi = median_ci(xs, 0.95)
        assert lo <= med <= hi
        covered += lo <= true_median <= hi
    assert 0.92 <= covered / trials <= 0.995, covered


def test_median_interval_ignores_a_heavy_tail_that_moves_p99():
    rng = random.Random(3)
    base = [1.0 + rng.random() * 0.05 for _ in range(200)]
    noisy = [x * (20 if rng.random() < 0.08 else 1) for x in base]  # 8 % of calls 20x: a busy host
    med, lo, hi = median_ci(noisy, 0.95)
    assert 1.0 <= lo <= med <= hi <= 1.07
    r, rlo, rhi = ratio_ci(noisy, base, 0.95)
    assert rlo <= 1.0 <= rhi and rhi < 1.1


def test_ratio_interval_of_a_real_slowdown_excludes_the_limit():
    rng = random.Random(5)
    base = [1.0 + rng.random() * 0.2 for _ in range(300)]
    slow = [1.5 * (1.0 + rng.random() * 0.2) for _ in range(300)]
    r, lo, hi = ratio_ci(slow, base, 0.95)
    assert 1.3 < lo <= r <= hi
    assert r == pytest.approx(1.5, rel=0.05)


def test_median_ci_errors():
    with pytest.raises(ValueError, match="median of no values"):
        median_ci([])
    with pytest.raises(ValueError, match="confidence 1.5 is outside"):
        median_ci([1.0], 1.5)


# ---------------------------------------------------------------------------------------------------
# the gate on stored records


class Records:
    """A minimal RecordStore: results by (key, kind) -> {name: record}."""

    def __init__(self):
        self.data: dict[tuple[str, str], dict[str, dict]] = {}

    def put(self, key: str, rec: dict) -> None:
        self.data.setdefault((key, "bench"), {})[f"{rec['device_kind']}--{rec['host']}"] = rec

    def results(self, key: str, kind: str) -> dict[str, dict]:
        return dict(self.data.get((key, kind), {}))


def rec(samples, *, host="h1", host_class="x86_64 CPU x2", session="s1", time_="2026-01-01T00:00:00+00:00",
        threads=2, kind="cpu"):
    s = sorted(samples)
    return {"format": 2, "target": "m/b1/fp32/p", "device_kind": kind, "host": host, "host_class": host_class,
            "session": session, "time": time_, "samples_ms": list(samples),
            "settings": {"threads": threads, "timing": "interleaved with eager", "warmup": 5, "sync": "none (cpu)"},
            "latency_ms": {"p50": s[len(s) // 2], "p99": s[-1]}}


def test_gate_passes_noise_refuses_slowdown_and_lists_what_it_cannot_compare():
    rng = random.Random(11)

    def noisy(scale: float, n: int = 150):
        return [scale * (1 + 0.1 * rng.random()) * (15 if rng.random() < 0.1 else 1) for _ in range(n)]

    st = Records()
    st.put("base", rec(noisy(1.0)))
    st.put("same", rec(noisy(1.0)))
    st.put("slow", rec(noisy(1.5)))
    g = latency_gate(st, {"b1": "same"}, {"b1": "base"}, "cpu", 1.3)
    assert g.passed, g.message
    row = g.figures["buckets"]["b1"]
    assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"] and row["ratio_low"] < 1.3
    assert row["same_session"] is True and g.figures["statistic"] == "median"
    g = latency_gate(st, {"b1": "slow"}, {"b1": "base"}, "cpu", 1.3)
    assert not g.passed
    row = g.figures["buckets"]["b1"]
    assert row["ratio_low"] > 1.3
    assert g.message == (f"b1 median latency is {row['ratio']:.2f}x the baseline's (95% interval "
                         f"{row['ratio_low']:.2f}-{row['ratio_high']:.2f}x; allowed 1.30x)")
    assert g.to_json()["verdict"] == "fail"

    # another host class, other settings, or an old record without samples: not compared, never refused
    st.put("other", rec(noisy(3.0), host="h2", host_class="aarch64 Graviton x64", session="s2"))
    g = latency_gate(st, {"b1": "other"}, {"b1": "base"}, "cpu", 1.3)
    assert g.passed and g.figures["buckets"] == {}
    assert g.figures["not_compared"] == {"b1": "benchmarked with different host class: aarch64 Graviton x64 vs "
                                                "x86_64 CPU x2"}
    st.put("threads", rec(noisy(3.0), session="s3", threads=1))
    assert "different settings" in latency_gate(st, {"b1": "threads"}, {"b1": "base"}, "cpu").figures[
        "not_compared"]["b1"]
    old = rec(noisy(3.0), session="s4")
    del old["samples_ms"]
    st.put("old", old)
    assert "keeps no samples" in latency_gate(st, {"b1": "old"}, {"b1": "base"}, "cpu").figures["not_compared"]["b1"]


def test_bench_result_reads_any_stored_record_and_gives_it_back():
    full = rec([1.0, 2.0, 3.0]) | {"eager": {"latency_ms": {"p50": 4.0}}, "speedup_vs_eager": 2.0,
                                   "a_later_key": [1]}
    r = BenchResult.from_json(full)
    assert r.median_ms == 2.0 and r.samples_ms == [1.0, 2.0, 3.0] and r.session == "s1"
    assert r.extra == {"a_later_key": [1]}
    assert r.to_json() == full and list(r.to_json()) == list(full)
    old = {"device_kind": "cpu", "latency_ms": {"p99": 2.0}}  # an early record: no samples, no session
    r = BenchResult.from_json(old)
    assert r.to_json() == old and r.samples_ms == [] and r.session is None and r.median_ms is None
    assert r.with_(validation={"verdict": "pass"}).to_json() == old | {"validation": {"verdict": "pass"}}


def test_pair_from_one_session_is_preferred_over_a_newer_one():
    a_old = rec([1.0] * 30, session="A", host="h1", time_="2026-01-01T00:00:00+00:00")
    b_old = rec([1.0] * 30, session="A", host="h1", time_="2026-01-01T00:00:00+00:00")
    a_new = rec([2.0] * 30, session="B", host="h2", time_="2026-02-01T00:00:00+00:00")
    c, b = pick_pair([a_new, a_old], [b_old])
    assert c is a_old and b is b_old
    assert comparable(a_new, b_old) is None  # comparable too, but not timed together
    assert pick_pair([], [b_old]) == "no benchmark of the candidate on this device kind"


# ---------------------------------------------------------------------------------------------------
# end to end: real artifacts, real benchmarks

MLP = '''
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 256, depth: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for lin in self.layers:
            x = torch.relu(lin(x))
        return x


def build(width: int = 256, depth: int = 3):
    return MLP(width, depth)
'''

EXTRA = '''
[models.mlp]
factory = "tinylib.mlp:build"
dtypes = ["fp32"]
profiles = ["p1", "p2"]
inputs = [{ name = "x", shape = [32, 256] }]

[release]
max_latency_ratio = 1.3
'''


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    root = tmp_path_factory.mktemp("latency") / "proj"
    cfg = write_tiny_project(root, extra=EXTRA)
    (root / "tinylib" / "mlp.py").write_text(MLP)
    r = run_cli("build", "-c", str(cfg), "-n", "2", "mlp")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("validate", "-c", str(cfg), "mlp")
    assert r.returncode == 0, r.stdout + r.stderr
    b = Builder(Workspace(load_project(cfg)))
    r1 = create_release(b.ws, "mlp", "fp32", "p1")
    r2 = create_release(b.ws, "mlp", "fp32", "p2")
    assert r1.artifacts[0].key != r2.artifacts[0].key
    return cfg, r1.id, r2.id


def _fresh_channels(cfg: Path) -> None:
    shutil.rmtree(cfg.parent / "artifacts" / "channels" / "mlp", ignore_errors=True)


def test_same_speed_passes_every_time_and_a_sleep_in_forward_is_refused(mlp):
    cfg, r1, r2 = mlp
    passes = []
    for _ in range(2):  # separate bench sessions, each followed by the promotion
        r = run_cli("bench", "-c", str(cfg), "mlp", "--warmup", "5", "--max-time", "3", "--threads", "1", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["schema"] == "neuron-build/bench/v1"
        recs = doc["records"]
        assert len({x["session"] for x in recs}) == 1 and len(recs) == 2
        for x in recs:
            lo, hi = x["median_ci_ms"]
            assert lo <= x["latency_ms"]["p50"] <= hi and x["iters"] == len(x["samples_ms"]) >= 30
            assert x["stopped_by"] in ("precision", "time") and x["host_class"]
        _fresh_channels(cfg)
        project = load_project(cfg)
        b = Builder(Workspace(project))
        promote(b.ws.store, project.config.release, "mlp", "dev", release=r1)
        e = promote(b.ws.store, project.config.release, "mlp", "dev", release=r2)
        g = next(g for g in e.gates if g["name"] == "latency")
        assert g["verdict"] == "pass" and g["figures"]["buckets"]["static"]["same_session"] is True
        passes.append(g["figures"]["buckets"]["static"]["ratio"])
    assert all(0.7 < p < 1.3 for p in passes), passes

    # the p2 artifact with a sleep of half the baseline's median added to its forward: 1.5x slower
    project = load_project(cfg)
    b = Builder(Workspace(project))
    base_median = recs[0]["latency_ms"]["p50"] if recs[0]["target"].endswith("p1") else recs[1]["latency_ms"]["p50"]
    nap = base_median / 2 / 1000

    def slowed(target, fn):
        if target.profile != "p2":
            return fn

        def forward(*a):
            out = fn(*a)
            t_end = time.perf_counter() + nap
            while time.perf_counter() < t_end:  # a sleep that does not oversleep by the scheduler's slice
                time.sleep(0)
            return out
        return forward

    timing = TimingSettings(warmup=5, iters=None, min_iters=30, max_time_s=3.0, threads=1)
    run = bench_selected(b.ws, [t for t in b.ws.targets if t.model == "mlp"], timing, wrap=slowed)
    slow = next(x for x in run.records if x.target.endswith("p2"))
    fast = next(x for x in run.records if x.target.endswith("p1"))
    assert slow.median_ms / fast.median_ms > 1.35
    _fresh_channels(cfg)
    promote(b.ws.store, project.config.release, "mlp", "dev", release=r1)
    r = run_cli("promote", "-c", str(cfg), "mlp", r2, "--to", "dev", "--json")
    assert r.returncode == 3, r.stdout + r.stderr
    entry = json.loads(r.stdout)
    assert entry["schema"] == "neuron-build/promote/v1" and entry["action"] == "refuse"
    assert entry["verdict"] == "fail"
    g = next(g for g in entry["gates"] if g["name"] == "latency")
    row = g["figures"]["buckets"]["static"]
    assert g["verdict"] == "fail" and row["ratio_low"] > 1.3, g
    assert r.stderr.startswith("error: promotion of ")

    # without --json: the gates on stderr, exit 3, and the fixes named
    r = run_cli("promote", "-c", str(cfg), "mlp", r2, "--to", "dev")
    assert r.returncode == 3 and "FAIL latency: static median latency is" in r.stderr
    assert "neuron-build bench mlp --against dev" in r.stderr and "--waive latency --reason" in r.stderr

    # a waiver needs a reason; with one, the gate is waived and the history says why
    r = run_cli("promote", "-c", str(cfg), "mlp", r2, "--to", "dev", "--waive", "latency")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: --waive latency needs --reason TEXT: a waived gate is recorded in the "
                                "channel's history with why")
    r = run_cli("promote", "-c", str(cfg), "mlp", r2, "--to", "dev", "--waive", "latency", "--reason",
                "known: batch path rewritten next sprint", "--json")
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)
    g = next(g for g in e["gates"] if g["name"] == "latency")
    assert g["verdict"] == "waived" and g["passed"] is True
    assert g["figures"]["waiver_reason"] == "known: batch path rewritten next sprint"
    assert e["waivers"] == [{"gate": "latency", "reason": "known: batch path rewritten next sprint"}]
    h = json.loads(run_cli("history", "-c", str(cfg), "mlp", "--channel", "dev", "--json").stdout)
    assert h["schema"] == "neuron-build/history/v1"
    assert [x["action"] for x in h["history"]] == ["promote", "refuse", "refuse", "promote"]
    assert h["history"][-1]["waivers"][0]["gate"] == "latency"
    r = run_cli("promote", "-c", str(cfg), "mlp", r2, "--to", "dev", "--waive", "channel_order", "--reason", "x")
    assert r.returncode == 2 and "not a gate that can be waived" in r.stderr and "allow_skip" in r.stderr
