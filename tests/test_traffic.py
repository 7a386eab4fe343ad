"""Serving traffic and ``buckets suggest``: the optimum against brute force, the recorder's memory cap, merging
files, ``--write`` keeping the file's comments, the errors, Prometheus metrics, and end to end: a built, released
and pulled tiny model serves generated traffic, saves it, and ``buckets suggest --json`` matches a brute-force
optimum and the runtime's own padding; the report page shows the traffic section in headless chromium."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_build.cli import main
from neuron_build.project import bucket_search
from neuron_build.project.bucket_search import evaluate, optimal_lists, round_up, serve, suggest
from neuron_build.traffic import TrafficRecorder, load_traffic
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project
from tests.helpers.runtime import fake_model, fake_release

# ---------------------------------------------------------------------------------------------------
# the optimum against brute force

def brute_1d(counts: dict[int, int], k: int, multiple: int | None) -> int:
    """The least padded positions over every list of at most k sizes (multiples of ``multiple``) that
    serves every value: all sizes up to the largest value rounded up are tried, not only the candidates."""
    top = round_up(max(counts), multiple)
    sizes = [s for s in range(1, top + 1) if not multiple or s % multiple == 0]
    best = None
    for n in range(1, k + 1):
        for combo in itertools.combinations(sizes, n):
            if combo[-1] < max(counts):
                continue
            padded = sum(c * (min(s for s in combo if s >= v) - v) for v, c in counts.items())
            best = padded if best is None else min(best, padded)
    return best


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.integers(1, 14), st.integers(1, 6), min_size=1, max_size=8), st.integers(1, 4),
       st.sampled_from([None, 1, 2, 3, 4]))
def test_one_dim_optimum_equals_brute_force(counts, k, multiple):
    curve = suggest({(v,): c for v, c in counts.items()}, ["seq"], k, multiple)
    best, method = curve[-1]
    want = brute_1d(counts, k, multiple)
    real = sum(c * v for v, c in counts.items())
    assert method == "exact"
    assert best.padded == want and best.padding_ratio == want / real
    assert len(best.buckets["seq"]) <= k and best.unserved == 0
    assert all(not multiple or s % multiple == 0 for s in best.buckets["seq"])
    # the sizes reported cost what is claimed, judged the way the runtime routes
    again = evaluate({(v,): c for v, c in counts.items()}, ["seq"], best.buckets)
    assert (again.padded, again.real, again.unserved) == (want, real, 0)
    # every budget of the curve is its own optimum, and more NEFFs never cost more padding
    for n, (ev, _m) in enumerate(curve, 1):
        assert ev.padded == brute_1d(counts, n, multiple)
    assert [ev.padded for ev, _ in curve] == sorted((ev.padded for ev, _ in curve), reverse=True)


def reference_dp(weights: dict[int, int], k: int) -> list[int]:
    """The plain O(k m^2) dynamic programme: the least sum(weight * bucket) per list length."""
    u = sorted(weights)
    pre = [0]
    for x in u:
        pre.append(pre[-1] + weights[x])
    inf = float("inf")
    f = [inf] + [u[j - 1] * pre[j] for j in range(1, len(u) + 1)]
    out = [f[-1]]
    for _ in range(2, min(k, len(u)) + 1):
        f = [inf] + [min(f[i] + u[j - 1] * (pre[j] - pre[i]) for i in range(j)) for j in range(1, len(u) + 1)]
        out.append(f[-1])
    return out


def test_divide_and_conquer_equals_the_plain_dynamic_programme_on_300_values():
    rng = random.Random(7)
    weights = {v: rng.choice([0, 1, 1, 2, 5, 40]) for v in rng.sample(range(1, 5000), 300)}
    got = optimal_lists(weights, 8)
    assert [c for c, _ in got] == reference_dp(weights, 8)
    for c, sizes in got:
        assert c == sum(w * min(s for s in sizes if s >= v) for v, w in weights.items())


def brute_2d(counts: dict[tuple[int, int], int], k: int, seq_multiple: int = 1) -> int:
    bmax, smax = max(v[0] for v in counts), max(v[1] for v in counts)
    best = None
    for nb in range(1, k + 1):
        for ns in range(1, k // nb + 1):
            for lb in itertools.combinations(range(1, bmax + 1), nb):
                if lb[-1] < bmax:
                    continue
                for ls in itertools.combinations(range(seq_multiple, round_up(smax, seq_multiple) + 1, seq_multiple), ns):
                    if ls[-1] < smax:
                        continue
                    p = sum(c * (min(x for x in lb if x >= b) * min(x for x in ls if x >= s) - b * s)
                            for (b, s), c in counts.items())
                    best = p if best is None else min(best, p)
    return best


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.tuples(st.integers(1, 4), st.integers(1, 7)), st.integers(1, 5), min_size=1, max_size=7),
       st.integers(1, 5))
def test_joint_search_exact_equals_brute_force_and_descent_never_beats_it(counts, k):
    best, method = suggest(counts, ["batch", "seq"], k)[-1]
    want = brute_2d(counts, k)
    assert method == "exact" and best.padded == want and best.neffs <= k
    assert evaluate(counts, ["batch", "seq"], best.buckets).padded == want
    old = bucket_search.JOINT_EXACT_LIMIT
    bucket_search.JOINT_EXACT_LIMIT = 0   # the heuristic: never better than the optimum, and honest
    try:
        h, hmethod = suggest(counts, ["batch", "seq"], k)[-1]
    finally:
        bucket_search.JOINT_EXACT_LIMIT = old
    assert h.padded >= want and h.neffs <= k
    assert evaluate(counts, ["batch", "seq"], h.buckets).padded == h.padded
    assert hmethod in ("exact", "coordinate-descent")


def test_multiple_rounds_the_sequence_dim_not_the_batch_dim():
    rng = random.Random(5)
    counts = {(rng.randint(1, 4), rng.randint(1, 11)): rng.randint(1, 9) for _ in range(12)}
    for k in (2, 3, 4):
        best, method = suggest(counts, ["batch", "seq"], k, [None, 4])[-1]
        assert method == "exact" and best.padded == brute_2d(counts, k, seq_multiple=4)
        assert all(s % 4 == 0 for s in best.buckets["seq"])


def test_current_buckets_chunks_truncation_and_unserved():
    counts = {(1, 5): 4, (3, 9): 2, (6, 16): 2, (1, 20): 3}
    cur = {"batch": [1, 2, 4], "seq": [8, 16]}
    ev = evaluate(counts, ["batch", "seq"], cur, batch_dim="batch")
    # (1,5) -> 1x8: 3 each; (3,9) -> 4x16: 37 each; (6,16) -> chunks 4x16 and 2x16: 0; (1,20): unserved
    assert (ev.padded, ev.real, ev.unserved, ev.chunked) == (4 * 3 + 2 * 37, 4 * 5 + 2 * 27 + 2 * 96, 3, 2)
    tr = evaluate(counts, ["batch", "seq"], cur, batch_dim="batch", truncate=True)
    assert (tr.unserved, tr.truncated, tr.padded, tr.real) == (0, 3, ev.padded, ev.real + 3 * 16)


# ---------------------------------------------------------------------------------------------------
# the recorder: memory cap, merging files, errors

def test_recorder_keeps_at_most_max_shapes_and_counts_the_overflow():
    r = TrafficRecorder("m", "r1", ["seq"], max_shapes=5)
    for v in range(1, 21):                        # 20 distinct shapes: 5 kept, 15 overflow
        r.record({"seq": v}, "s32", [("s32", {"seq": 32}, {"seq": v})])
    for _ in range(7):                            # a kept shape keeps counting
        r.record({"seq": 3}, "s32", [("s32", {"seq": 32}, {"seq": 3})])
    snap = r.snapshot()
    assert len(r.shapes) == 5 and len(snap["shapes"]) == 5
    assert (snap["calls"], snap["overflow_calls"]) == (27, 15)
    assert {s["sizes"]["seq"]: s["count"] for s in snap["shapes"]} == {1: 1, 2: 1, 3: 8, 4: 1, 5: 1}
    b = snap["buckets"]["s32"]                    # bucket totals are exact, overflow included
    assert (b["calls"], b["elements"], b["padded"]) == (27, sum(range(1, 21)) + 21, 27 * 32 - sum(range(1, 21)) - 21)
    for v in range(100, 5000):                    # memory stays bounded however many new shapes come
        r.record({"seq": v}, None)
    assert len(r.shapes) == 5 and r.overflow_calls == 15 + 4900 and r.unserved == 4900


def test_files_of_replicas_and_days_merge_by_summing(tmp_path):
    rng = random.Random(3)
    whole = TrafficRecorder("m", "r1", ["batch", "seq"])
    a = TrafficRecorder("m", "r1", ["batch", "seq"])
    b = TrafficRecorder("m", "r2", ["batch", "seq"])
    files = []
    for day in range(3):
        for rec in (a, b):
            for _ in range(50):
                v = {"batch": rng.randint(1, 2), "seq": rng.choice([7, 12, 30])}
                bs = {"batch": 2, "seq": 32}
                for x in (rec, whole):
                    x.record(v, "b2-s32", [("b2-s32", bs, v)])
            files.append(rec.save(tmp_path / f"{id(rec)}-{day}.jsonl", reset=True))   # one file per replica per day
    assert a.calls == 0 and b.calls == 0          # reset once written
    got = load_traffic(files)["m"]
    want = load_traffic([whole.save(tmp_path / "whole.jsonl")])["m"]
    assert got.calls == want.calls == 300
    assert got.shapes == want.shapes and got.buckets == want.buckets
    assert got.counts(["seq"]) == want.counts(["seq"]) and sum(got.counts(["seq"]).values()) == 300
    assert got.releases == ["r1", "r2"] and len(got.files) == 6


@pytest.mark.parametrize("lines,message", [
    (['{"kind": "shape"}'], r"bad.jsonl:1: the first line has kind 'shape', not \"traffic\""),
    (["HEAD", "not json"], r"bad.jsonl:2: not JSON"),
    (["HEAD", '{"kind": "shape", "sizes": {"seq": -3}, "bucket": null, "count": 1}'],
     r"bad.jsonl:2: 'sizes.seq' is -3, not an integer >= 1"),
    (["HEAD", '{"kind": "shape", "sizes": {"seq": 3}, "bucket": null, "count": true}'],
     r"bad.jsonl:2: 'count' is True, not an integer >= 0"),
    (["HEAD", '{"kind": "gossip"}'], r"bad.jsonl:2: unknown kind 'gossip'"),
    ([], r"bad.jsonl: empty traffic file"),
])
def test_a_garbled_file_is_one_error_naming_file_and_line(tmp_path, lines, message):
    from neuron_build.errors import UserError

    head = json.dumps({"kind": "traffic", "schema": "neuron-build/traffic/v1", "model": "m", "dims": ["seq"]})
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(head if x == "HEAD" else x for x in lines) + "\n")
    with pytest.raises(UserError, match=message):
        load_traffic([p])


# ---------------------------------------------------------------------------------------------------
# the command: errors, --write keeping comments

COMMENTED = '''
# serving model; buckets from `neuron-build buckets suggest`
[models.enc]
factory = "tinylib.tiny:build"   # the tiny one
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", "seq", 16] }]

# sizes per dim
[models.enc.buckets]
batch = [1, 4]     # batch sizes
seq = [
  16,   # short
  64,
]   # long ones
'''


def enc_traffic(path: Path, seqs: dict[int, int], batch: int = 1) -> Path:
    r = TrafficRecorder("enc", "r-x", ["batch", "seq"])
    for s, n in seqs.items():
        for _ in range(n):
            r.record({"batch": batch, "seq": s}, None)
    return r.save(path)


def test_write_edits_buckets_in_place_keeping_comments_and_prints_the_plan_difference(tmp_path, capsys):
    cfg = write_tiny_project(tmp_path / "proj", extra=COMMENTED)
    before = cfg.read_text()
    tr = enc_traffic(tmp_path / "t.jsonl", {10: 30, 40: 5, 60: 20})
    assert main(["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "2",
                 "--multiple", "8", "--write", "--json", "-c", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "neuron-build/buckets-suggest/v1"
    assert doc["suggested"]["buckets"] == {"seq": [16, 64]} and doc["written"]["changed"] is False  # already optimal
    assert cfg.read_text() == before

    # the search keeps today's largest bucket (64) unless --narrow: then [10, 40, 60] would refuse the requests
    # of 61-64 that today's [16, 64] serves: said, and refused without --force
    assert main(["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "3",
                 "--json", "-c", str(cfg)]) == 0
    assert json.loads(capsys.readouterr().out)["suggested"]["buckets"] == {"seq": [10, 40, 64]}
    assert main(["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "3",
                 "--narrow", "--write", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "serve seq up to 60 (today up to 64: requests of 61 to 64 would be refused); drop --narrow to keep " \
           "today's largest bucket, or add --force" in err
    assert cfg.read_text() == before
    assert main(["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "3",
                 "--narrow", "--write", "--force", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "NARROWER THAN TODAY: the suggestion serves seq up to 60, the current buckets up to 64" in out
    after = cfg.read_text()
    assert "seq = [10, 40, 60]   # long ones" in after
    # every other line of the file is as it was, comments included
    assert before.replace("seq = [\n  16,   # short\n  64,\n]   # long ones", "seq = [10, 40, 60]   # long ones") == after
    assert "# serving model; buckets from `neuron-build buckets suggest`" in after and "batch = [1, 4]     # batch sizes" in after
    assert "wrote " in out and "seq = [10, 40, 60] (was [16, 64])" in out
    assert "plan: 6 added, 0 kept, 4 no longer in the matrix" in out
    assert "  + enc/b1-s10/fp32/p1" in out and "  - enc/b4-s64/fp32/p1" in out
    from neuron_build.project.config import load_project

    assert load_project(cfg).config.models["enc"].buckets == {"batch": (1, 4), "seq": (10, 40, 60)}


def test_applying_a_suggestion_is_a_domain_function_without_the_cli(tmp_path):
    """traffic.model_traffic sums and checks the files; config_edit.apply_suggestion refuses a narrower
    suggestion (file untouched) and writes it with force, returning the plan's difference."""
    from neuron_build.errors import UserError
    from neuron_build.project.bucket_search import narrower_dims, suggestion
    from neuron_build.project.config import load_project
    from neuron_build.project.config_edit import apply_suggestion
    from neuron_build.traffic import model_traffic

    cfg = write_tiny_project(tmp_path / "proj", extra=COMMENTED)
    before = cfg.read_text()
    files = [enc_traffic(tmp_path / "a.jsonl", {10: 30, 40: 5}), enc_traffic(tmp_path / "b.jsonl", {60: 20})]
    mt = model_traffic("enc", files, ["seq"])
    assert mt.counts(["seq"]) == {(10,): 30, (40,): 5, (60,): 20}
    with pytest.raises(UserError, match="a.jsonl: holds traffic of model 'enc', not 'other'"):
        model_traffic("other", files, ["seq"])
    with pytest.raises(UserError, match="its requests have dims \\['batch', 'seq'\\], not 'len'"):
        model_traffic("enc", files, ["len"])
    project = load_project(cfg)
    doc = suggestion(project.config.models["enc"], mt, ["seq"], 3, narrow=True)
    doc["narrower_than_current"] = narrower_dims(doc)
    assert doc["narrower_than_current"] == {"seq": {"current": 64, "suggested": 60}}
    with pytest.raises(UserError, match="not written: the suggested buckets seq=\\[10, 40, 60\\] serve seq up to 60"):
        apply_suggestion(project, "enc", doc)
    assert cfg.read_text() == before
    w = apply_suggestion(project, "enc", doc, force=True)
    assert (w["changed"], w["buckets"], w["was"]) == (True, {"seq": [10, 40, 60]}, {"seq": [16, 64]})
    assert (len(w["added"]), w["kept"], len(w["removed"])) == (6, [], 4)
    assert load_project(cfg).config.models["enc"].buckets == {"batch": (1, 4), "seq": (10, 40, 60)}


def test_a_suggestion_that_pads_more_than_today_is_said_and_write_refuses_it_without_force(tmp_path, capsys):
    """The docs' own `--multiple 64 --write`: today's seq = [16, 64] pads 22.35 % of this traffic; the best two
    multiples of 64 (just [64]) pad 107.06 %. That is said plainly, --write refuses it (exit 2, file as it
    was) and --force writes it."""
    cfg = write_tiny_project(tmp_path / "proj", extra=COMMENTED)
    before = cfg.read_text()
    tr = enc_traffic(tmp_path / "t.jsonl", {10: 30, 40: 5, 60: 20})
    argv = ["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "2", "--multiple",
            "64", "-c", str(cfg)]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"]["padded"] == 380 and doc["current"]["real"] == 1700
    assert doc["suggested"]["buckets"] == {"seq": [64]} and doc["suggested"]["padded"] == 1820
    assert doc["worse_than_current"] is True and doc["suggested_source"] == "search"
    assert main(argv) == 0
    assert "WORSE THAN TODAY: the suggestion pads 107.06 %, the current buckets 22.35 %; --write refuses it " \
           "without --force" in capsys.readouterr().out
    assert main([*argv, "--write"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {cfg}: not written: the suggested buckets seq=[64] pad 107.06 %, more than the current "
                   f"seq=[16, 64] (22.35 %); drop --multiple (today's 16 is no multiple of 64), or add --force to "
                   f"write them anyway\n")
    assert cfg.read_text() == before
    assert main([*argv, "--write", "--force"]) == 0
    assert "seq = [64]   # long ones" in cfg.read_text()


def test_the_current_buckets_are_a_candidate_of_the_suggestion(monkeypatch):
    """Coordinate descent can end above today's buckets; they are then the suggestion, not a worse search
    result (and a tie keeps them too: no rewrite for nothing)."""
    from neuron_build.project.bucket_search import Evaluation, current_is_candidate

    cur = Evaluation({"seq": [16, 64]}, padded=380, real=1700)
    assert current_is_candidate(cur, 2, {"seq": None}) and current_is_candidate(cur, 2, {"seq": 16})
    assert not current_is_candidate(cur, 1, {"seq": None})        # more NEFFs than the budget
    assert not current_is_candidate(cur, 2, {"seq": 64})          # 16 is no multiple of 64
    assert not current_is_candidate(Evaluation({"seq": [16]}, 0, 10, unserved=1), 2, {"seq": None})

    class Spec:
        buckets = {"seq": (16, 64)}
        truncate = False
        inputs = []

    class Traffic:
        def counts(self, dims):
            return {(10,): 30, (40,): 5, (60,): 20}

    # a search that finds only worse buckets than today's (as coordinate descent can)
    monkeypatch.setattr(bucket_search, "suggest", lambda counts, dims, k, m, tops=None: [
        (Evaluation({"seq": [64]}, 1820, 1700), "coordinate-descent")])
    doc = bucket_search.suggestion(Spec(), Traffic(), ["seq"], 2)
    assert doc["suggested"]["buckets"] == {"seq": [16, 64]} and doc["suggested_source"] == "current"
    assert doc["worse_than_current"] is False and doc["suggested_method"] == "current"


def test_suggest_errors_are_one_line(tmp_path, capsys):
    cfg = write_tiny_project(tmp_path / "proj", extra=COMMENTED)
    tr = enc_traffic(tmp_path / "t.jsonl", {10: 3})
    other = TrafficRecorder("tiny", "r", ["batch"])
    other.record({"batch": 1}, None)
    otherf = other.save(tmp_path / "tiny.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(tr.read_text() + "{oops\n")
    cases = [(["nosuch", "--traffic", str(tr)], "error: unknown model 'nosuch'; "),
             (["enc", "--traffic", str(tr), "--dim", "width"],
              "error: 'width' is not a bucket dim of model 'enc' (its bucket dims: batch, seq)"),
             (["enc", "--traffic", str(tmp_path / "missing.jsonl")],
              f"error: {tmp_path / 'missing.jsonl'}: cannot read the traffic file (No such file or directory)"),
             (["enc", "--traffic", str(bad)], f"error: {bad}:3: not JSON"),
             (["enc", "--traffic", str(tr), str(otherf)], f"error: {otherf}: holds traffic of model 'tiny', not 'enc'"),
             (["tiny", "--traffic", str(tr)], f"error: {tr}: holds traffic of model 'enc', not 'tiny'"),
             (["other", "--traffic", str(otherf)], "error: model 'other' has no bucket dims")]
    for argv, msg in cases:
        assert main(["buckets", "suggest", *argv, "--max-buckets", "2", "-c", str(cfg)]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(msg) and err.count("\n") == 1, err


# ---------------------------------------------------------------------------------------------------
# Prometheus: opt-in, on the caller's registry only

def test_prometheus_metrics_only_on_the_given_registry():
    import prometheus_client
    import torch

    from neuron_build.runtime import BucketedModel, BucketError, PulledRelease

    def mods(rel):
        return {b.id: (lambda ids, mask, feats: ids.float()) for b in rel.buckets}

    rel = PulledRelease.from_json(fake_release(), "fake release.json")
    plain = BucketedModel(rel, Path("/nonexistent"), modules=mods(rel))
    reg = prometheus_client.CollectorRegistry()
    m = BucketedModel(rel, Path("/nonexistent"), modules=mods(rel), metrics=reg)

    def call(model, b, s):
        model(torch.zeros(b, s, dtype=torch.int64), torch.zeros(b, s, dtype=torch.int64), torch.zeros(b, s, 4))

    for model in (plain, m):
        call(model, 1, 5)
        call(model, 3, 9)
        with pytest.raises(BucketError):
            call(model, 1, 20)
    assert reg.get_sample_value("neuron_build_serving_calls_total", {"model": "enc", "bucket": "b1-s8"}) == 1
    assert reg.get_sample_value("neuron_build_serving_elements_total",
                                {"model": "enc", "bucket": "b4-s16", "kind": "padding"}) == 64 - 27
    assert reg.get_sample_value("neuron_build_serving_padding_ratio", {"model": "enc", "bucket": "b1-s8"}) == 3 / 5
    assert reg.get_sample_value("neuron_build_serving_unserved_total", {"model": "enc"}) == 1
    names = {s.name for f in prometheus_client.REGISTRY.collect() for s in f.samples}
    assert not any(n.startswith("neuron_build_serving") for n in names)   # nothing registered globally
    assert plain.traffic()["shapes"] == m.traffic()["shapes"] and plain.traffic()["unserved"] == 1


# ---------------------------------------------------------------------------------------------------
# end to end: build, release, pull, serve generated traffic, save, suggest

def test_served_traffic_gives_the_brute_force_optimum_and_the_current_padding(tmp_path):
    import torch

    from neuron_build.runtime import BucketedModel
    from tests.helpers.chromium import Browser

    cfg = write_tiny_project(tmp_path / "proj")
    assert run_cli("build", "-c", str(cfg), "-n", "2", "tiny/*/fp32/p1").returncode == 0
    rid = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q", "-c", str(cfg)).stdout.strip()
    assert run_cli("promote", "tiny", rid, "--to", "dev", "--allow-unvalidated", "--reason", "traffic test",
                   "-c", str(cfg)).returncode == 0
    serve = tmp_path / "serve"
    assert run_cli("pull", "tiny", "--channel", "dev", "--dest", str(serve), "-c", str(cfg)).returncode == 0

    rng = random.Random(11)
    served: list[int] = []
    files = []
    for replica in ("a", "b"):                      # two replicas of the pulled release
        m = BucketedModel.load(serve)
        for _ in range(60):
            n = rng.choices([1, 2, 3, 4, 5, 6], weights=[5, 1, 4, 2, 1, 2])[0]   # 5 and 6: run in chunks of 4
            assert m(torch.randn(n, 16)).shape == (n, 16)
            served.append(n)
        files.append(m.save_traffic(tmp_path / f"traffic-{replica}.jsonl"))
    total = load_traffic(files)["tiny"]
    assert sum(total.counts(["batch"]).values()) == 120 == total.calls

    r = run_cli("buckets", "suggest", "tiny", "--traffic", *map(str, files), "--max-buckets", "3", "--json",
                "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    counts: dict[int, int] = {}
    for n in served:
        counts[n] = counts.get(n, 0) + 1
    real = sum(served)
    want = brute_1d(counts, 3, None)
    assert doc["suggested"]["padded"] == want and doc["suggested"]["padding_ratio"] == want / real
    assert doc["suggested"]["unserved"] == 0 and max(doc["suggested"]["buckets"]["batch"]) == 6

    def padding_now(n: int) -> int:                 # buckets [1, 4]; a batch over 4 runs as chunks of 4 and the rest
        chunks = [4] * (n // 4) + ([n % 4] if n % 4 else []) if n > 4 else [n]
        return sum(min(b for b in (1, 4) if b >= c) - c for c in chunks)
    cur = sum(padding_now(n) for n in served)
    assert doc["current"]["buckets"] == {"batch": [1, 4]}
    assert (doc["current"]["padded"], doc["current"]["padding_ratio"], doc["current"]["unserved"]) == (cur, cur / real, 0)
    # the runtime's own per-bucket padding, summed over the files, is the same figure
    assert sum(p for _c, _e, p in total.buckets.values()) == cur
    assert [c["budget"] for c in doc["curve"]] == [1, 2, 3]
    assert [c["padded"] for c in doc["curve"]] == [brute_1d(counts, k, None) for k in (1, 2, 3)]
    assert doc["curve"][1]["gain"] == doc["curve"][0]["padding_ratio"] - doc["curve"][1]["padding_ratio"]

    text = run_cli("buckets", "suggest", "tiny", "--traffic", *map(str, files), "--max-buckets", "3",
                   "-c", str(cfg)).stdout
    assert "current    batch=[1, 4]" in text and f"{100 * cur / real:.2f} %" in text

    # the report page with the traffic section, in headless chromium
    page = tmp_path / "report.html"
    r = run_cli("report", "--html", str(page), "--traffic", *map(str, files), "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    with Browser() as b:
        got = b.load(page)
        assert got["errors"] == [] and got["requests"] == [page.resolve().as_uri()]
        rows = b.evaluate("[...document.querySelectorAll('#traffic-tiny-buckets tr')].map(tr => "
                          "[...tr.children].map(td => td.textContent))")
        sug = b.evaluate("[...document.querySelectorAll('#traffic-tiny-suggestion tr')].map(tr => "
                         "[...tr.children].map(td => td.textContent))")
        width = b.evaluate("document.querySelector('#chart-padding-tiny svg').getBoundingClientRect().width")
    by_bucket = {row[0]: row for row in rows[1:]}
    assert set(by_bucket) == {"b1", "b4"} and width > 300
    assert sum(int(row[4]) for row in rows[1:]) == cur and sum(int(row[2]) for row in rows[1:]) >= 120
    two = [c for c in doc["curve"] if c["budget"] == 2][0]
    assert sug[1][:4] == ["current", "batch=[1, 4]", "2", f"{100 * cur / real:.2f} %"]
    assert sug[2][0] == "suggested" and sug[2][3] == f"{100 * two['padding_ratio']:.2f} %"
    assert math.isclose(float(sug[2][3].rstrip(" %")), 100 * brute_1d(counts, 2, None) / real, abs_tol=0.005)


ENC = '''
[models.enc]
factory = "tinylib.tiny:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [
  { name = "ids", shape = ["batch", "seq"], dtype = "int64", range = [0, 100] },
  { name = "mask", shape = ["batch", "seq"], dtype = "int64", range = [0, 2] },
  { name = "feats", shape = ["batch", "seq", 4] },
]
buckets = { batch = [1, 2, 4], seq = [8, 16] }
'''


def test_one_dim_of_a_two_dim_release_served_and_suggested(tmp_path):
    """``--dim seq`` on a batch x seq model: the seq padding of the served requests, unserved ones counted."""
    import torch

    from neuron_build.runtime import BucketError

    cfg = write_tiny_project(tmp_path / "proj", extra=ENC)
    m, _ = fake_model()
    rng = random.Random(2)
    served = []
    for _ in range(80):
        b, s = rng.choice([1, 1, 2, 3, 6]), rng.choice([1, 3, 5, 8, 9, 12, 16, 20])
        args = (torch.zeros(b, s, dtype=torch.int64), torch.zeros(b, s, dtype=torch.int64), torch.zeros(b, s, 4))
        if s > 16:  # longer than the longest seq bucket: refused (and still recorded as traffic)
            with pytest.raises(BucketError):
                m(*args)
        else:
            m(*args)
        served.append(s)
    f = m.save_traffic(tmp_path / "t.jsonl")
    r = run_cli("buckets", "suggest", "enc", "--traffic", str(f), "--dim", "seq", "--max-buckets", "2", "--json",
                "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ok = [s for s in served if s <= 16]
    cur = sum(min(x for x in (8, 16) if x >= s) - s for s in ok)
    assert doc["current"] == {**doc["current"], "buckets": {"seq": [8, 16]}, "padded": cur, "real": sum(ok),
                                   "padding_ratio": cur / sum(ok), "unserved": len(served) - len(ok)}
    counts = {s: served.count(s) for s in set(served)}
    assert doc["suggested"]["padded"] == brute_1d(counts, 2, None) and doc["suggested"]["unserved"] == 0
    assert doc["other_dims"] == {"batch": [1, 2, 4]} and doc["dims"] == ["seq"]


DOCS_LIKE = '''
[models.enc]
factory = "tinylib.tiny:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", "seq", 16] }]
buckets = { batch = [8], seq = [32, 64, 128] }
'''


def test_suggest_never_advises_what_write_refuses_and_keeps_todays_top_bucket(tmp_path, capsys):
    """docs/traffic.md's walk-through on minilm's buckets (seq = [32, 64, 128]) and traffic that has not (yet)
    held a request over 100: the search keeps today's largest bucket (128), so the suggestion never narrows what
    is served; a dry run says `add --write` only when --write would write, and a refusal's advice works."""
    cfg = write_tiny_project(tmp_path / "proj", extra=DOCS_LIKE)
    tr = enc_traffic(tmp_path / "t.jsonl", {10: 30, 40: 5, 60: 20}, batch=8)
    base = ["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "-c", str(cfg)]
    for k in ("4", "5", "6", "8"):
        assert main([*base, "--max-buckets", k, "--multiple", "32", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert max(doc["suggested"]["buckets"]["seq"]) == 128 and doc["narrower_than_current"] == {}, k
    # docs' --multiple 64: 32 is no multiple of 64 and every list of multiples of 64 pads more than today's
    argv = [*base, "--max-buckets", "4", "--multiple", "64"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "next: add --write" not in out
    assert "next: drop --multiple (today's 32 is no multiple of 64), or add --write --force" in out
    assert main([*argv, "--write"]) == 2
    err = capsys.readouterr().err
    assert "drop --multiple (today's 32 is no multiple of 64), or add --force" in err
    assert "--max-buckets" not in err        # more NEFFs cannot help: only 64 and 128 are candidates
    # the docs' form with --multiple 32 writes (no refusal)
    assert main([*base, "--max-buckets", "4", "--multiple", "32"]) == 0
    assert "next: add --write" in capsys.readouterr().out
    assert main([*base, "--max-buckets", "4", "--multiple", "32", "--write"]) == 0
    # the advice works: without --multiple nothing is refused, and the largest bucket stays 128
    assert main([*base, "--max-buckets", "4", "--write"]) == 0
    from neuron_build.project.config import load_project

    assert load_project(cfg).config.models["enc"].buckets["seq"] == (10, 40, 60, 128)


def test_a_refusal_that_more_neffs_would_lift_names_the_budget(tmp_path, capsys):
    """A suggestion worse than today because the budget is too small: the refusal names the smallest
    --max-buckets whose suggestion pads no more than today's buckets, and that budget writes."""
    cfg = write_tiny_project(tmp_path / "proj", extra=DOCS_LIKE)
    tr = enc_traffic(tmp_path / "t.jsonl", {10: 30, 40: 5, 60: 20}, batch=8)
    base = ["buckets", "suggest", "enc", "--traffic", str(tr), "--dim", "seq", "-c", str(cfg), "--multiple", "32"]
    assert main([*base, "--max-buckets", "2", "--write"]) == 2
    err = capsys.readouterr().err
    assert "--max-buckets 3" in err and "--max-buckets one more" not in err
    assert main([*base, "--max-buckets", "3", "--write"]) == 0


def test_the_joint_search_keeps_todays_largest_bucket_of_every_dim():
    """Two dims, exact and coordinate descent alike: every budget's lists end at today's largest sizes (a
    candidate that serves no request seen), and the padding is the brute force's over such lists."""
    counts = {(1, 10): 30, (2, 40): 5, (1, 60): 20, (3, 12): 7}
    for limit in (bucket_search.JOINT_EXACT_LIMIT, 0):      # 0: every split by coordinate descent
        old = bucket_search.JOINT_EXACT_LIMIT
        bucket_search.JOINT_EXACT_LIMIT = limit
        try:
            curve = suggest(counts, ["batch", "seq"], 6, [None, 8], tops=[4, 128])
        finally:
            bucket_search.JOINT_EXACT_LIMIT = old
        assert curve and all(max(ev.buckets["batch"]) == 4 and max(ev.buckets["seq"]) == 128 for ev, _m in curve)
        assert all(s % 8 == 0 for ev, _m in curve for s in ev.buckets["seq"])
    best = min(curve[-1][0].padded, suggest(counts, ["batch", "seq"], 6, [None, 8], tops=[4, 128])[-1][0].padded)
    real = sum(c * b * s for (b, s), c in counts.items())
    brute = min(sum(c * serve(b, bl) * serve(s, sl) for (b, s), c in counts.items()) - real
                for nb in range(1, 4) for bl in itertools.combinations([1, 2, 3], nb - 1)
                for ns in range(1, 6 // nb + 1) for sl in itertools.combinations([16, 40, 64], ns - 1)
                for bl in [sorted([*bl, 4])] for sl in [sorted([*sl, 128])])
    assert best == brute
