"""Release records on the tiny project: what a release pins, what it refuses, typed records read back."""

from __future__ import annotations

import subprocess

import pytest

from neuron_build.build.builder import Builder
from neuron_build.errors import UserError
from neuron_build.project.config import load_project
from neuron_build.release import (
    ChannelPointer,
    HistoryEntry,
    PromotionRefused,
    Release,
    create_release,
    load_release,
    promote,
    rollback,
)
from neuron_build.store.local import LocalStore
from neuron_build.workspace import Workspace
from tests.helpers.cli import run_cli
from tests.helpers.releases import ACTOR, ctx, make


def test_release_record(proj):
    project, b, store, _ = ctx(proj)
    made = create_release(b.ws, "tiny", "fp32", "p1")
    assert isinstance(made, Release) and made.model == "tiny" and made.artifacts[0].loader == "torch.jit.load"
    rel = made.to_json()
    assert rel["id"].startswith("r-") and len(rel["id"]) == 18
    assert (rel["model"], rel["dtype"], rel["profile"], rel["backend"], rel["hardware_target"]) == (
        "tiny", "fp32", "p1", "torchscript", "cpu")
    targets = {t.id: b.ws.key(t).key for t in b.ws.targets if t.model == "tiny" and t.dtype == "fp32" and t.profile == "p1"}
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
    assert store.release("tiny", rel["id"]) == rel and store.release_ids("tiny") == [rel["id"]]
    # same artifacts again: same id, the first record stays untouched (a record is written once)
    assert create_release(Workspace(project), "tiny", "fp32", "p1") == made
    assert store.release("tiny", rel["id"]) == rel and store.release_ids("tiny") == [rel["id"]]
    assert store.put_release("tiny", rel["id"], {**rel, "creator": "someone else"}) is False
    assert store.release("tiny", rel["id"]) == rel
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
    assert list(LocalStore(load_project(proj).store_url()).releases()) == []  # no record written


def test_release_refuses_mixed_toolchains(proj, monkeypatch):
    project = load_project(proj)
    b = Builder(Workspace(project))
    assert b.build(b.ws.by_id["tiny/b1/fp32/p2"]).status == "PASS"
    # b4 built by a host with another torch: its key differs from this checkout's only in the toolchain
    monkeypatch.setattr("neuron_build.project.keys.toolchain_versions", lambda backend: {"torch": "9.9.9"})
    other = Builder(Workspace(project))
    assert other.build(other.ws.by_id["tiny/b4/fp32/p2"]).status == "PASS"
    monkeypatch.undo()
    monkeypatch.setenv("NEURON_BUILD_ACTOR", ACTOR)
    torch_version = Workspace(project).keys.key(b.ws.by_id["tiny/b1/fp32/p2"]).details["toolchain"]["torch"]
    with pytest.raises(UserError) as ei:
        create_release(Workspace(project), "tiny", "fp32", "p2")
    msg = str(ei.value)
    assert "its buckets were built with different toolchains" in msg
    assert f"tiny/b1/fp32/p2: built with a different toolchain than the others: torch={torch_version}" in msg
    assert "tiny/b4/fp32/p2: built with a different toolchain than the others: torch=9.9.9" in msg

    # once every bucket is from the other toolchain, the release is made from those artifacts
    monkeypatch.setattr("neuron_build.project.keys.toolchain_versions", lambda backend: {"torch": "9.9.9"})
    other = Builder(Workspace(project))
    assert other.build(other.ws.by_id["tiny/b1/fp32/p2"]).status == "PASS"
    monkeypatch.undo()
    rel = create_release(Workspace(project), "tiny", "fp32", "p2")
    assert rel.toolchain == {"torch": "9.9.9"}


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

