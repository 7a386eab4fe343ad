"""Releases, gates, promotion (compare-and-swap), rollback, history and pull on the tiny project."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli, write_tiny_project

from neuron_build.build.builder import Builder
from neuron_build.errors import UserError
from neuron_build.project.config import load_project
from neuron_build.release import (
    SWAP_ATTEMPTS,
    ChannelPointer,
    HistoryEntry,
    PromotionRefused,
    Release,
    channel_history,
    channel_pointer,
    create_release,
    load_release,
    promote,
    pull,
    rollback,
)
from neuron_build.release.pull import MARKER
from neuron_build.store import layout
from neuron_build.store.local import LocalStore
from neuron_build.util import percentile

ACTOR = "tester@ci"

PICKY = '''
import torch
from torch import nn


class Picky(nn.Module):
    """Fails to trace at batch 4, so one bucket of two fails to build."""

    def forward(self, x):
        if x.shape[0] == 4:
            raise RuntimeError("picky: batch 4 is not supported on purpose")
        return x * 3


def build():
    return Picky()
'''

PICKY_CONFIG = '''
[models.picky]
factory = "tinylib.picky:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 16] }]
buckets = { batch = [1, 4] }
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A tiny project with tiny fp32/p1 and bf16/p1 built (4 compiles), shared by the module's tests:
    each test works on a copy (:func:`proj`)."""
    root = tmp_path_factory.mktemp("release") / "proj"
    cfg = write_tiny_project(root, extra=PICKY_CONFIG)
    (root / "tinylib" / "picky.py").write_text(PICKY)
    r = run_cli("build", "-c", str(cfg), "-n", "2", "tiny/*/fp32/p1", "tiny/*/bf16/p1")
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


@pytest.fixture
def proj(built, tmp_path, monkeypatch) -> Path:
    """A private copy of the built project (keys do not depend on the path, so it is fully cached)."""
    monkeypatch.setenv("NEURON_BUILD_ACTOR", ACTOR)
    dest = tmp_path / "proj"
    shutil.copytree(built.parent, dest, ignore=shutil.ignore_patterns(".neuron-build", "__pycache__"))
    return dest / "buckets.toml"


def set_release_config(cfg: Path, text: str) -> None:
    cfg.write_text(cfg.read_text() + "\n[release]\n" + text + "\n")


def ctx(cfg: Path):
    project = load_project(cfg)
    b = Builder(project)
    return project, b, b.store, project.config.release


def make(cfg: Path, dtype: str = "fp32", profile: str = "p1") -> dict:
    _, b, _, _ = ctx(cfg)
    return create_release(b, "tiny", dtype, profile)


def validate_all(store: LocalStore, rel: dict, kind: str = "cpu", verdict: str = "pass") -> None:
    for a in rel["artifacts"]:
        store.put_result(a["key"], "validation", kind, {"verdict": verdict, "reason": None,
                                                           "device_kind": kind, "outputs": []})


def bench_all(store: LocalStore, rel: dict, median_ms: float, kind: str = "cpu", session: str = "s1") -> None:
    """Benchmark records of one session: 101 samples spread +-2 % around ``median_ms``, one call in ten
    20x slower (a busy host's tail, which the gate must ignore)."""
    samples = [median_ms * (0.98 + 0.04 * i / 100) * (20 if i % 10 == 3 else 1) for i in range(101)]
    for a in rel["artifacts"]:
        store.put_result(a["key"], "bench", f"{kind}--hostA", {
            "format": 2, "device_kind": kind, "host": "hostA", "host_class": "x86_64 test x2", "session": session,
            "settings": {"threads": 1, "timing": "interleaved with eager", "warmup": 5, "sync": "none (cpu)"},
            "latency_ms": {"p50": median_ms, "p99": max(samples)}, "samples_ms": samples,
            "throughput_per_s": 1000 / median_ms, "iters": len(samples), "time": "2026-01-01T00:00:00+00:00"})


def gate(entry: dict, name: str) -> dict:
    return next(g for g in entry["gates"] if g["name"] == name)


def refused(store, settings, to, **kw) -> dict:
    with pytest.raises(PromotionRefused) as ei:
        promote(store, settings, "tiny", to, **kw)
    return ei.value.entry | {"message": str(ei.value)}


# ---------------------------------------------------------------------------------------------------
# release records

def test_release_record(proj):
    project, b, store, _ = ctx(proj)
    rel = create_release(b, "tiny", "fp32", "p1")
    assert rel["id"].startswith("r-") and len(rel["id"]) == 18
    assert (rel["model"], rel["dtype"], rel["profile"], rel["backend"], rel["hardware_target"]) == (
        "tiny", "fp32", "p1", "torchscript", "cpu")
    targets = {t.id: b.key(t).key for t in b.targets if t.model == "tiny" and t.dtype == "fp32" and t.profile == "p1"}
    assert {a["target"]: a["key"] for a in rel["artifacts"]} == targets
    for a in rel["artifacts"]:
        m = store.manifest(a["key"])
        assert a["files"] == {n: {"sha256": f.sha256, "size": f.size} for n, f in m.files.items()}
        assert a["artifact"] == "model.pt" and a["loader"] == "torch.jit.load"
        assert a["bucket"] == {"batch": int(a["bucket_id"][1:])}
        assert a["inputs"] == [{"name": "x", "shape": [a["bucket"]["batch"], 16], "dtype": "fp32", "range": None}]
        am = rel["metrics"]["artifacts"][a["target"]]
        assert am["op_count"] == m.metrics.op_count == 3  # aten::linear, aten::relu, aten::mul
        assert am["compile_time_s"] == m.metrics.compile_time_s
        assert am["validation"] == {} and am["bench"] == {}
    times = [rel["metrics"]["artifacts"][t]["compile_time_s"] for t in targets]
    assert rel["metrics"]["compile_time_p95_s"] == max(times)
    assert rel["metrics"]["op_count_total"] == 6
    assert rel["toolchain"] == store.manifest(rel["artifacts"][0]["key"]).toolchain
    assert rel["runtime"] == {"dims": ["batch"], "inputs": [{"name": "x", "shape": ["batch", 16], "dtype": "fp32",
                                                             "pad": 0.0}], "truncate": False, "convert_dtypes": False}
    assert rel["git_commit"] is None and rel["creator"] == ACTOR
    path = store.root / "releases" / "tiny" / f"{rel['id']}.json"
    assert json.loads(path.read_text()) == rel
    # same artifacts again: same id, the first record stays untouched
    before = path.read_bytes()
    assert create_release(Builder(project), "tiny", "fp32", "p1") == rel
    assert path.read_bytes() == before
    # another dtype is another release
    assert make(proj, "bf16")["id"] != rel["id"]
    assert load_release(store, "tiny", rel["id"][:10])["id"] == rel["id"]


def test_release_records_git_commit(proj):
    root = proj.parent
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "buckets.toml", "tinylib"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "x"], cwd=root, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    rel = make(proj)
    assert rel["git_commit"] == head and len(head) == 40
    assert rel["git_dirty"] is True  # artifacts/ is not ignored in this scratch repo


def test_release_needs_dtype_and_profile_choice(proj):
    r = run_cli("release", "tiny", "-c", str(proj))
    assert r.returncode == 2
    assert "choose with --dtype (fp32, bf16) and --profile (p1, p2)" in r.stderr
    r = run_cli("release", "tiny", "--dtype", "fp16", "--profile", "p1", "-c", str(proj))
    assert r.returncode == 2 and "not built for dtype 'fp16'; its dtypes in buckets.toml: fp32, bf16" in r.stderr
    r = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "--backend", "inductor", "-c", str(proj))
    assert r.returncode == 2 and "cannot release tiny fp32/p1 (inductor): 2 of 2 bucket(s) missing" in r.stderr
    r = run_cli("release", "nope", "-c", str(proj))
    assert r.returncode == 2 and "unknown model 'nope'" in r.stderr
    r = run_cli("release", "other", "-q", "-c", str(proj))  # one dtype, one profile: no choice needed
    assert r.returncode == 2 and "other/static/fp32/p1: missing: not built" in r.stderr


def test_release_refuses_missing_and_failed_buckets(proj):
    r = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p2", "-c", str(proj))
    assert r.returncode == 2
    assert "cannot release tiny fp32/p2 (torchscript): 2 of 2 bucket(s) missing or failed" in r.stderr
    assert "tiny/b1/fp32/p2: missing: not built" in r.stderr and "tiny/b4/fp32/p2: missing: not built" in r.stderr
    assert "Traceback" not in r.stderr

    b = run_cli("build", "picky", "-c", str(proj))
    assert b.returncode == 1  # picky/b4 fails to trace on purpose
    r = run_cli("release", "picky", "-c", str(proj))
    assert r.returncode == 2
    assert "1 of 2 bucket(s) missing or failed" in r.stderr
    assert "picky/b4/fp32/p1: failed: ERROR" in r.stderr and "batch 4 is not supported" in r.stderr
    assert "picky/b1/fp32/p1" not in r.stderr

    # a stale bucket (model source changed since its build) is missing, with what changed
    act = proj.parent / "tinylib" / "act.py"
    act.write_text(act.read_text() + "# edited\n")
    r = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "-c", str(proj))
    assert r.returncode == 2
    assert "tiny/b1/fp32/p1: missing: not built for this checkout (changed since its last build: model: " \
           "sources.tinylib/act.py" in r.stderr
    assert not (LocalStore(load_project(proj).store_url()).root / "releases").exists()


def test_release_refuses_mixed_toolchains(proj, monkeypatch):
    project = load_project(proj)
    b = Builder(project)
    assert b.build(b.by_id["tiny/b1/fp32/p2"]).status == "PASS"
    # b4 built by a host with another torch: its key differs from this checkout's only in the toolchain
    monkeypatch.setattr("neuron_build.project.keys.toolchain_versions", lambda backend: {"torch": "9.9.9"})
    other = Builder(project)
    assert other.build(other.by_id["tiny/b4/fp32/p2"]).status == "PASS"
    monkeypatch.undo()
    monkeypatch.setenv("NEURON_BUILD_ACTOR", ACTOR)
    torch_version = Builder(project).keys.key(b.by_id["tiny/b1/fp32/p2"]).details["toolchain"]["torch"]
    with pytest.raises(UserError) as ei:
        create_release(Builder(project), "tiny", "fp32", "p2")
    msg = str(ei.value)
    assert "its buckets were built with different toolchains" in msg
    assert f"tiny/b1/fp32/p2: built with a different toolchain than the others: torch={torch_version}" in msg
    assert "tiny/b4/fp32/p2: built with a different toolchain than the others: torch=9.9.9" in msg

    # once every bucket is from the other toolchain, the release is made from those artifacts
    monkeypatch.setattr("neuron_build.project.keys.toolchain_versions", lambda backend: {"torch": "9.9.9"})
    other = Builder(project)
    assert other.build(other.by_id["tiny/b1/fp32/p2"]).status == "PASS"
    monkeypatch.undo()
    rel = create_release(Builder(project), "tiny", "fp32", "p2")
    assert rel["toolchain"] == {"torch": "9.9.9"}


def test_percentile_nearest_rank():
    assert percentile([3.0, 1.0, 2.0], 95, method="nearest-rank") == 3.0
    assert percentile(range(1, 101), 95, method="nearest-rank") == 95
    assert percentile(range(1, 21), 95, method="nearest-rank") == 19
    assert percentile([5.0], 50) == 5.0


# ---------------------------------------------------------------------------------------------------
# gates, one by one, each with its figures

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
    assert promote(store, settings, "tiny", "staging", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")["version"] == 1

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
    assert entry["allow_unvalidated"] is True
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
                                               "latency", "compile_time_p95", "serving_toolchain", "warmup"]
    warm = e["gates"][-1]  # a torchscript release holds compiled models: nothing to warm
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


def test_unknown_channel_and_source(proj):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    with pytest.raises(UserError, match=r"unknown channel 'qa' \(--to\); channels under \[release\] in "
                                        r"buckets.toml: dev, staging, prod"):
        promote(store, settings, "tiny", "qa", release=r1["id"])
    with pytest.raises(UserError, match="channel 'dev' of model 'tiny' holds no release yet"):
        promote(store, settings, "tiny", "staging", from_channel="dev")
    with pytest.raises(UserError, match="no release 'r-0000000000000000' of model 'tiny'"):
        promote(store, settings, "tiny", "dev", release="r-0000000000000000")
    with pytest.raises(UserError, match="either a RELEASE id or --from CHANNEL"):
        promote(store, settings, "tiny", "dev")
    assert store.history("tiny", "qa") == []


# ---------------------------------------------------------------------------------------------------
# the race: two promotions from separate processes

def _race(cfg: str, release: str, barrier, queue) -> None:
    os.environ["NEURON_BUILD_ACTOR"] = f"racer-{release}"
    project = load_project(cfg)
    store = LocalStore(project.store_url())
    try:
        e = promote(store, project.config.release, "tiny", "dev", release=release, allow_unvalidated=True,
                    reason=f"race {release}", before_swap=lambda: barrier.wait(timeout=120))
        queue.put(("won", release, e["version"], ""))
    except PromotionRefused as ex:
        queue.put(("lost", release, ex.entry["version"], str(ex)))
    except BaseException as ex:  # report anything else to the test instead of hanging it
        queue.put(("error", release, None, repr(ex)))


def test_two_racing_promotions_both_land_each_checked_against_the_other(proj):
    """Two promotions read the empty channel at once; exactly one compare-and-swap wins. The loser reads
    the channel again, checks its gates again against the winner's release, and lands on top of it."""
    _, _, store, _ = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    mp = multiprocessing.get_context("spawn")
    barrier, queue = mp.Barrier(2), mp.Queue()
    procs = [mp.Process(target=_race, args=(str(proj), r["id"], barrier, queue)) for r in (r1, r2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(r[0] for r in results) == ["won", "won"], results
    first, second = sorted(results, key=lambda r: r[2])
    assert (first[2], second[2]) == (1, 2)
    ptr = channel_pointer(store, "tiny", "dev")
    assert (ptr["release"], ptr["version"], ptr["previous"]) == (second[1], 2, first[1])
    hist = channel_history(store, "tiny", "dev")
    assert [(h["action"], h["from"], h["to"], h["version"]) for h in hist] == [
        ("promote", None, first[1], 1), ("promote", first[1], second[1], 2)]
    assert all(g["passed"] for h in hist for g in h["gates"])


def test_a_promotion_gives_up_on_a_channel_that_keeps_moving(proj, monkeypatch):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    calls = []

    def always_lose(model, channel, pointer, expected):
        calls.append(expected)
        return False

    monkeypatch.setattr(store, "swap_channel", always_lose)
    with pytest.raises(PromotionRefused) as ei:
        promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    assert len(calls) == SWAP_ATTEMPTS
    assert str(ei.value) == (f"tiny/dev moved {SWAP_ATTEMPTS} times while this promotion of {r1['id']} was being "
                             f"checked (compare-and-swap lost each time); nothing changed. Re-run the promotion")
    assert channel_pointer(store, "tiny", "dev") is None
    assert [h["action"] for h in channel_history(store, "tiny", "dev")] == ["refuse"]


# ---------------------------------------------------------------------------------------------------
# rollback

def test_rollback_restores_previous_release(proj):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    for r in (r1, r2):
        validate_all(store, r)
    with pytest.raises(UserError, match="tiny/dev holds no release; nothing to roll back"):
        rollback(store, settings, "tiny", "dev")
    promote(store, settings, "tiny", "dev", release=r1["id"], reason="first")
    with pytest.raises(UserError, match=f"tiny/dev has held only {r1['id']}; there is no earlier release"):
        rollback(store, settings, "tiny", "dev")
    promote(store, settings, "tiny", "dev", release=r2["id"], reason="bf16")
    e = rollback(store, settings, "tiny", "dev", reason="bf16 too slow")
    assert (e["from"], e["to"], e["version"], e["action"]) == (r2["id"], r1["id"], 3, "rollback")
    ptr = channel_pointer(store, "tiny", "dev")
    assert (ptr["release"], ptr["version"], ptr["previous"], ptr["action"]) == (r1["id"], 3, r2["id"], "rollback")
    # rolling back again has nowhere to go: the stack is back to [r1]
    with pytest.raises(UserError, match="has held only"):
        rollback(store, settings, "tiny", "dev")
    # r2 was rolled back: promoting it again needs a reason; then a rollback returns to r1 again
    with pytest.raises(PromotionRefused, match=f"release {r2['id']} was rolled back from tiny/dev at .* "
                                               r'\("bf16 too slow"\); promoting it again needs --reason TEXT'):
        promote(store, settings, "tiny", "dev", release=r2["id"])
    e = promote(store, settings, "tiny", "dev", release=r2["id"], reason="fixed the slow path")
    assert [(x["channel"], x["reason"]) for x in e["rolled_back"]] == [("dev", "bf16 too slow")]
    assert rollback(store, settings, "tiny", "dev")["to"] == r1["id"]
    hist = channel_history(store, "tiny", "dev")
    assert [(h["action"], h["from"], h["to"], h["version"]) for h in hist] == [
        ("promote", None, r1["id"], 1), ("promote", r1["id"], r2["id"], 2), ("rollback", r2["id"], r1["id"], 3),
        ("refuse", r1["id"], r2["id"], 3), ("promote", r1["id"], r2["id"], 4), ("rollback", r2["id"], r1["id"], 5)]
    assert hist[2]["reason"] == "bf16 too slow" and hist[2]["who"] == ACTOR


def test_rollback_refuses_when_artifacts_are_gone(proj):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    store.quarantine(r1["artifacts"][0]["key"], "test")
    with pytest.raises(UserError, match=f"cannot roll tiny/dev back to {r1['id']}: artifacts missing from the "
                                        f"store: tiny/b1/fp32/p1"):
        rollback(store, settings, "tiny", "dev")
    assert channel_pointer(store, "tiny", "dev")["release"] == r2["id"]
    with pytest.raises(UserError, match=f"release {r1['id']} cannot be promoted: artifacts missing from the "
                                        f"store: tiny/b1/fp32/p1"):
        promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")


def test_typed_records_read_back_unchanged(proj):
    """Release records, channel pointers and history lines as the store holds them read back through the
    typed models field for field and in the same key order; records of another shape read as None."""
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    with pytest.raises(PromotionRefused):
        promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="bf16")
    rollback(store, settings, "tiny", "dev", reason="back")
    raws = [r for _, _, r in store.releases("tiny")]
    assert len(raws) == 2
    for raw in raws:
        back = Release.from_json(raw).to_json()
        assert back == raw and list(back) == list(raw)
    ptr = store.channel("tiny", "dev")
    assert list(ChannelPointer.from_json(ptr).to_json().items()) == list(ptr.items())
    hist = store.history("tiny", "dev")
    assert [h["action"] for h in hist] == ["promote", "refuse", "promote", "rollback"]
    for h in hist:
        assert list(HistoryEntry.from_json(h).to_json().items()) == list(h.items())
    for bad in (None, [], "r-1", {"id": 1}, {"id": "r-1", "model": "tiny", "artifacts": [{"key": "k"}]}):
        assert Release.from_json(bad) is None
    assert ChannelPointer.from_json({"version": 1}) is None and HistoryEntry.from_json({"to": "r-1"}) is None


# ---------------------------------------------------------------------------------------------------
# pull

def tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def blob_of(store: LocalStore, rel: dict, i: int, name: str = "model.pt") -> Path:
    return store.path(layout.blob_path(rel["artifacts"][i]["files"][name]["sha256"]))


def test_pull_verifies_and_refuses_tampered_object(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve" / "tiny"
    doc = pull(store, "tiny", "dev", dest, settings)
    assert doc["release"] == r1["id"] and doc["channel_version"] == 1
    assert sorted(tree(dest)) == [MARKER, "b1/manifest.json", "b1/model.pt", "b4/manifest.json", "b4/model.pt",
                                  "release.json"]  # no worker.log: logs are not part of a release
    assert json.loads((dest / "release.json").read_text()) == doc
    marker = json.loads((dest / MARKER).read_text())
    assert (marker["release"], marker["channel"], marker["files"]) == (
        r1["id"], "dev", ["b1/manifest.json", "b1/model.pt", "b4/manifest.json", "b4/model.pt", "release.json"])
    assert doc["inputs"] == [{"name": "x", "shape": ["batch", 16], "dtype": "fp32", "pad": 0.0}]
    assert [(b["id"], b["sizes"], b["inputs"], b["artifact"], b["loader"]) for b in doc["buckets"]] == [
        ("b1", {"batch": 1}, [{"name": "x", "shape": [1, 16], "dtype": "fp32"}], "b1/model.pt", "torch.jit.load"),
        ("b4", {"batch": 4}, [{"name": "x", "shape": [4, 16], "dtype": "fp32"}], "b4/model.pt", "torch.jit.load")]
    for b in doc["buckets"]:
        for name, ent in b["files"].items():
            data = (dest / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == ent["sha256"] and len(data) == ent["size"]
            assert data == store.path(layout.blob_path(ent["sha256"])).read_bytes()

    # tamper one byte of a stored model blob (same size, so only the checksum can tell); the tiny model
    # traces to the same bytes at every batch size, so b1 and b4 share that blob: stored once
    before = tree(dest)
    assert blob_of(store, r1, 0) == blob_of(store, r1, 1)
    victim = blob_of(store, r1, 0)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    os.chmod(victim, 0o644)
    victim.write_bytes(bytes(raw))
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert (f"tiny/b1/fp32/p1 (key {r1['artifacts'][0]['key'][:12]}): model.pt (blob {victim.name[:16]}...) in "
            f"{store.location} does not match its sha256: the stored blob is damaged; `neuron-build verify --deep "
            f"--repair` (moves the damaged blob to quarantine/), then `neuron-build build tiny/b1/fp32/p1` compiles it "
            f"again; unless that compile is byte-identical (AOTInductor's is not) it is a new artifact the release "
            f"does not pin: make and promote a new release (`neuron-build release tiny && neuron-build promote tiny "
            f"RELEASE --to dev`)") == str(ei.value)
    assert tree(dest) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tiny"]  # no staging folder left behind
    # the CLI says the same, exit 2, and a fresh DIR is not created
    fresh = tmp_path / "serve2"
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", str(fresh), "-c", str(proj))
    assert r.returncode == 2 and "does not match its sha256" in r.stderr and "Traceback" not in r.stderr
    assert not fresh.exists()

    # a missing blob
    victim.unlink()
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert str(ei.value) == (
        f"tiny/b1/fp32/p1 (key {r1['artifacts'][0]['key'][:12]}): model.pt (blob {victim.name[:16]}...) is missing "
        f"from the store {store.location}; `neuron-build build tiny/b1/fp32/p1` compiles it again; unless that "
        f"compile is byte-identical (AOTInductor's is not) it is a new artifact the release does not pin: make and "
        f"promote a new release (`neuron-build release tiny && neuron-build promote tiny RELEASE --to dev`), or "
        f"promote another release")
    assert tree(dest) == before


def test_pull_replaces_its_own_folder_and_keeps_what_it_did_not_write(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    (dest / "notes.txt").write_text("written by the operator")
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert str(ei.value) == (f"--dest {dest} holds files the earlier pull did not write (notes.txt); a pull "
                             f"replaces only its own files: move them out of the folder, then pull again")
    assert (dest / "notes.txt").read_text() == "written by the operator"
    assert json.loads((dest / "release.json").read_text())["release"] == r1["id"]
    (dest / "notes.txt").unlink()
    doc = pull(store, "tiny", "dev", dest, settings)
    assert doc["release"] == r2["id"] and doc["dtype"] == "bf16"
    assert json.loads((dest / "release.json").read_text())["release"] == r2["id"]
    assert json.loads((dest / MARKER).read_text())["release"] == r2["id"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "serve"]  # no staging or old folder left
    with pytest.raises(UserError, match="channel tiny/staging holds no release"):
        pull(store, "tiny", "staging", tmp_path / "x", settings)


def test_an_interrupted_pull_leaves_the_previous_one_intact(proj, tmp_path, monkeypatch):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    before = tree(dest)
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    real, n = store.get_blob, []

    def dies_midway(sha, path):
        n.append(sha)
        if len(n) == 2:
            raise KeyboardInterrupt  # Ctrl-C after the first file
        real(sha, path)

    monkeypatch.setattr(store, "get_blob", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        pull(store, "tiny", "dev", dest, settings)
    assert tree(dest) == before and sorted(p.name for p in tmp_path.iterdir()) == ["proj", "serve"]


# ---------------------------------------------------------------------------------------------------
# the CLI, end to end

def test_cli_release_flow_and_history(proj, tmp_path):
    c = ["-c", str(proj)]
    r = run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "-q", *c)
    assert r.returncode == 0, r.stderr
    r1 = r.stdout.strip()
    r2 = run_cli("release", "tiny", "--dtype", "bf16", "--profile", "p1", "-q", *c).stdout.strip()
    assert r1.startswith("r-") and r2.startswith("r-") and r1 != r2
    rec = json.loads(run_cli("release", "tiny", "--dtype", "fp32", "--profile", "p1", "--json", *c).stdout)
    assert rec["id"] == r1

    r = run_cli("promote", "tiny", r1, "--to", "dev", *c)
    assert r.returncode == 3 and "FAIL validated: not validated on cpu" in r.stderr and "Traceback" not in r.stderr
    assert "validate on cpu with `neuron-build validate tiny`, or pass --allow-unvalidated --reason TEXT" in r.stderr
    r = run_cli("promote", "tiny", r1, "--to", "dev", "--allow-unvalidated", *c)
    assert r.returncode == 2 and "--allow-unvalidated needs --reason TEXT" in r.stderr
    store = LocalStore(load_project(proj).store_url())
    for rid in (r1, r2):
        validate_all(store, load_release(store, "tiny", rid))
    r = run_cli("promote", "tiny", r1, "--to", "dev", "--reason", "first cut", *c)
    assert r.returncode == 0, r.stderr
    assert f"promoted {r1} into tiny/dev (version 1; was empty)" in r.stdout
    assert "PASS validated: 2 artifact(s) passed validation on cpu" in r.stdout
    assert run_cli("promote", "tiny", "--from", "dev", "--to", "staging", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c).returncode == 0
    # bf16 follows the same way
    assert run_cli("promote", "tiny", r2, "--to", "dev", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "dev", "--to", "staging", *c).returncode == 0
    assert run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c).returncode == 0

    doc = json.loads(run_cli("channels", "tiny", "--json", *c).stdout)
    assert doc["schema"] == "neuron-build/channels/v1"
    rows = doc["channels"]
    assert all(isinstance(x["age_s"], float) and 0 <= x["age_s"] < 600 for x in rows)
    assert [(x["channel"], x["release"], x["version"], x["dtype"]) for x in rows] == [
        ("dev", r2, 2, "bf16"), ("staging", r2, 2, "bf16"), ("prod", r2, 2, "bf16")]
    text = run_cli("channels", *c).stdout
    assert f"tiny             prod       {r2}  v2  bf16/p1" in text

    r = run_cli("rollback", "tiny", "--channel", "prod", "--reason", "regression", *c)
    assert r.returncode == 0 and f"rolled tiny/prod back from {r2} to {r1} (version 3)" in r.stdout
    dest = tmp_path / "prod"
    r = run_cli("pull", "tiny", "--channel", "prod", "--dest", str(dest), *c)
    assert r.returncode == 0, r.stderr
    assert json.loads((dest / "release.json").read_text())["release"] == r1
    from neuron_build.runtime import warmup  # a release of compiled models warms up too: nothing compiles

    rep = warmup(dest)
    assert (rep["backend"], rep["zero_compiles"], rep["compiles_total"]) == ("torchscript", True, 0)
    assert [b["compiles"] for b in rep["buckets"]] == [0] * len(rep["buckets"]) and rep["buckets"]

    hist = json.loads(run_cli("history", "tiny", "--channel", "prod", "--json", *c).stdout)["history"]
    assert [(h["action"], h["from"], h["to"], h["who"]) for h in hist] == [
        ("promote", None, r1, ACTOR), ("promote", r1, r2, ACTOR), ("rollback", r2, r1, ACTOR)]
    assert hist[0]["source"] == {"channel": "staging", "version": 1}
    dev = json.loads(run_cli("history", "tiny", "--channel", "dev", "--json", *c).stdout)["history"]
    assert [h["action"] for h in dev] == ["refuse", "promote", "promote"]
    assert dev[1]["reason"] == "first cut" and dev[0]["gates"][1]["passed"] is False
    text = run_cli("history", "tiny", "--channel", "dev", *c).stdout
    assert "refuse   - -> " + r1 in text and "FAIL validated: not validated on cpu" in text
    assert store.channel("tiny", "prod")["release"] == r1

    r = run_cli("rollback", "tiny", "--channel", "nope", *c)
    assert r.returncode == 2 and "unknown channel 'nope' (--channel)" in r.stderr

    # the rolled-back release is marked, and promoting it again needs a reason
    rels = json.loads(run_cli("releases", "tiny", "--json", *c).stdout)
    assert rels["schema"] == "neuron-build/releases/v1"
    by_id = {x["id"]: x for x in rels["releases"]}
    assert by_id[r2]["channels"] == ["dev", "staging"] and by_id[r1]["channels"] == ["prod"]
    assert [(x["channel"], x["reason"]) for x in by_id[r2]["rolled_back"]] == [("prod", "regression")]
    assert by_id[r1]["rolled_back"] == []
    text = run_cli("releases", "tiny", *c).stdout
    assert f'{r2}  bf16/p1' in text and 'ROLLED BACK from prod' in text and '("regression")' in text
    r = run_cli("promote", "tiny", "--from", "staging", "--to", "prod", *c)
    assert r.returncode == 3
    assert (f"release {r2} was rolled back from tiny/prod at " in r.stderr
            and "; promoting it again needs --reason TEXT (recorded in the history)" in r.stderr)
    r = run_cli("promote", "tiny", "--from", "staging", "--to", "prod", "--reason", "fixed upstream", "--json", *c)
    assert r.returncode == 0, r.stderr
    e = json.loads(r.stdout)
    assert e["verdict"] == "pass" and e["rolled_back"][0]["channel"] == "prod" and e["reason"] == "fixed upstream"


def test_pull_never_replaces_a_folder_it_did_not_write(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("important")
    with pytest.raises(UserError, match="is a folder with other content"):
        pull(store, "tiny", "dev", keep, settings)
    assert (keep / "notes.txt").read_text() == "important" and sorted(os.listdir(keep)) == ["notes.txt"]
    with pytest.raises(UserError, match="--dest is empty"):
        pull(store, "tiny", "dev", "", settings)
    with pytest.raises(UserError, match="notes.txt is a file, not a folder"):
        pull(store, "tiny", "dev", keep / "notes.txt" / "sub", settings)
    # an earlier pull's folder is replaced by the new pull
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    assert pull(store, "tiny", "dev", dest, settings)["release"] == r1["id"]


# ---------------------------------------------------------------------------------------------------
# versions checked before they bite

def test_promote_refuses_a_release_built_for_another_serving_torch(proj):
    import importlib.metadata as md

    torch_v = md.version("torch")
    set_release_config(proj, 'serving = { torch = "2.12.*" }\nchannel_serving = { staging = { torch = "2.13.*" } }')
    _, _, store, settings = ctx(proj)
    assert settings.serving_for("dev") == {"torch": "==2.12.*"}
    r1 = make(proj)
    e = refused(store, settings, "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    g = gate(e, "serving_toolchain")
    assert not g["passed"]
    assert g["message"] == (f"built with torch {torch_v}, but channel 'dev' serves torch==2.12.* "
                            f"([release] serving / channel_serving)")
    assert f"FAIL serving_toolchain: built with torch {torch_v}" in e["message"]
    settings = settings.model_copy(update={"allow_skip": True})
    ok = promote(store, settings, "tiny", "staging", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    assert gate(ok, "serving_toolchain")["passed"]


def test_serving_config_errors(proj):
    from neuron_build.errors import ConfigError

    set_release_config(proj, 'channel_serving = { qa = { torch = "2.13.*" } }\nserving = { torch = "two" }')
    with pytest.raises(ConfigError) as ei:
        load_project(proj)
    text = str(ei.value)
    assert "release.serving: torch = 'two' is not a version specifier" in text
    assert "release.channel_serving: names channel 'qa', which is not in channels (dev, staging, prod)" in text


def _rebuilt_with(proj: Path, torch_version: str) -> None:
    """Make every stored artifact of the project say it was built with ``torch_version``."""
    from conftest import manifest_file, rewrite_manifest

    _, _, store, _ = ctx(proj)
    for key in store.keys():
        rewrite_manifest(manifest_file(store, key),
                         lambda m: m["toolchain"].update(torch=torch_version))


def test_pull_refuses_a_release_this_host_cannot_load(proj, tmp_path):
    import importlib.metadata as md

    torch_v = md.version("torch")
    _rebuilt_with(proj, "2.99.0")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    assert r1["toolchain"]["torch"] == "2.99.0"
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    msg = str(ei.value)
    assert msg.startswith(f"release {r1['id']} of tiny (dev): built with torch 2.99.0, but this host has "
                          f"torch {torch_v}; a TorchScript module (.pt) needs torch>=2.99,<3")
    assert "\n" not in msg and not dest.exists()
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", str(dest), "-c", str(proj))
    assert r.returncode == 2 and "built with torch 2.99.0, but this host has torch" in r.stderr


def test_load_refuses_an_artifact_built_for_another_torch(proj, tmp_path):
    import importlib.metadata as md

    from neuron_build.artifact import AOTI_LOADER, LOAD_RULES, load_requirements, version_problem
    from neuron_build.runtime import BucketedModel

    torch_v = md.version("torch")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    assert BucketedModel.load(dest).buckets  # the host's own torch loads it
    doc = json.loads((dest / "release.json").read_text())
    doc["toolchain"]["torch"] = "2.99.1"
    (dest / "release.json").write_text(json.dumps(doc))
    with pytest.raises(UserError) as ei:
        BucketedModel.load(dest)
    assert str(ei.value).startswith(f"{dest / 'release.json'} (release {r1['id']} of tiny): built with torch "
                                    f"2.99.1, but this host has torch {torch_v}")
    # an AOTInductor package needs the very same torch release; the rule is a table by artifact kind
    for b in doc["buckets"]:
        b["loader"] = AOTI_LOADER
    doc["toolchain"]["torch"] = "2.13.9"
    (dest / "release.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"built with torch 2\.13\.9, but this host has torch .*AOTInductor "
                                        r"package \(\.pt2\) needs torch==2\.13\.9"):
        BucketedModel.load(dest)
    assert set(LOAD_RULES) == {"aoti", "torchscript", "neuron", "compile-cache"}
    assert load_requirements("neuron", {"torch": "2.13.0", "torch-neuronx": "2.13.0.2.30.4217"}) == {
        "torch": "==2.13.*", "torch-neuronx": ">=2.13.0.2.30.4217"}
    assert version_problem("neuron", {"torch": "2.13.0", "torch-neuronx": "2.13.0.2.30"},
                           {"torch": "2.13.1", "torch-neuronx": None}, "x") == (
        "x: built with torch-neuronx 2.13.0.2.30, but torch-neuronx is not installed here; this Neuron "
        "TorchScript module with NEFF (.pt) needs torch-neuronx>=2.13.0.2.30")
