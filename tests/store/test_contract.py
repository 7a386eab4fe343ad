"""The store contract (``neuron_build/store/contract.py``), one suite for every implementation.

Each implementation is a fixture case: the store itself, plus two hooks the suite needs from outside
the contract: ``damage(key, name, data)`` (overwrite the blob that file ``name`` of a published artifact
points to, or with ``name`` ``manifest.json`` the artifact's manifest, as rot or a tamperer would) and
``snapshot()`` (everything the store holds, to prove that reads do not write). Everything else goes
through contract methods only.
The shared-store issue adds its remote implementations as further cases here.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path

import pytest

from neuron_build.status import Status
from neuron_build.store import ArtifactStore, LocalStore, layout
from neuron_build.store.contract import ActionCache, Coordination, ObjectIO, RecordStore, ReleaseStore
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.store.remote import RemoteStore
from tests.helpers.store import FILES, KEY_A, KEY_B, entry, manifest, publish


class Case:
    """One implementation under test with its out-of-contract hooks."""

    def __init__(self, store: ArtifactStore, damage, snapshot):
        self.store, self.damage, self.snapshot = store, damage, snapshot


def _local(tmp_path: Path) -> Case:
    store = LocalStore(tmp_path / "store")

    def damage(key: str, name: str, data: bytes) -> None:
        if name == "manifest.json":
            path = store.path(layout.manifest_path(key))
        else:
            path = store.path(layout.blob_path(store.raw_manifest(key)["files"][name]["sha256"]))
        os.chmod(path, 0o644)  # blobs are stored read-only
        path.write_bytes(data)

    def snapshot() -> list[tuple[str, int, bytes]]:
        root = store.root
        if not root.exists():
            return []
        return sorted((p.relative_to(root).as_posix(), p.stat().st_size, p.read_bytes())
                      for p in root.rglob("*") if p.is_file())

    return Case(store, damage, snapshot)


def _remote_hooks(store: RemoteStore) -> tuple:
    """damage and snapshot of a remote store, written with the filesystem's own client (outside the
    contract: a tamperer does not ask the store)."""

    def damage(key: str, name: str, data: bytes) -> None:
        rel = layout.manifest_path(key) if name == "manifest.json" else layout.blob_path(
            store.raw_manifest(key)["files"][name]["sha256"])
        store.io.fs.pipe_file(store.io.full(rel), data)
        store.io.invalidate()

    def snapshot() -> list[tuple[str, int, bytes]]:
        return sorted((rel, len(b := store.io.fs.cat_file(store.io.full(rel))), b) for rel in store.io.find(""))

    return damage, snapshot


def _memory(tmp_path: Path) -> Case:
    store = RemoteStore(f"memory://contract-{secrets.token_hex(4)}", cache_dir=tmp_path / "cache")
    return Case(store, *_remote_hooks(store))


def _file(tmp_path: Path) -> Case:
    store = RemoteStore(f"file://{tmp_path}/shared", cache_dir=tmp_path / "cache")
    return Case(store, *_remote_hooks(store))


def _s3(tmp_path: Path) -> Case:
    store = RemoteStore(f"s3://{_S3_BUCKET[0]}/some/prefix", cache_dir=tmp_path / "cache")
    return Case(store, *_remote_hooks(store))


def _read_through(tmp_path: Path) -> Case:
    """A local store read through to a memory:// remote: damage reaches both copies (a tamperer of one
    copy only is healed by the other, which is the point of the pair), the snapshot covers both."""
    from neuron_build.store.tiered import ReadThroughStore

    local, remote = _local(tmp_path / "here"), _memory(tmp_path / "there")
    store = ReadThroughStore(local.store, remote.store)

    def damage(key: str, name: str, data: bytes) -> None:
        for c in (local, remote):
            if c.store.raw_manifest(key) is not None:
                c.damage(key, name, data)

    return Case(store, damage, lambda: [local.snapshot(), remote.snapshot()])


_S3_BUCKET: list[str] = []
IMPLEMENTATIONS = {"local": _local, "memory": _memory, "file-url": _file, "s3": _s3, "read-through": _read_through}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def case(request, tmp_path) -> Case:
    if request.param == "s3":
        _S3_BUCKET[:] = [request.getfixturevalue("s3_bucket")]
    return IMPLEMENTATIONS[request.param](tmp_path)


# -- the action cache --------------------------------------------------------------------------------

def test_an_absent_key_is_a_typed_miss(case):
    s = case.store
    found = s.lookup(KEY_A)
    assert (found.key, found.hit, found.manifest, found.damage) == (KEY_A, False, None, None)
    assert not s.is_complete(KEY_A) and s.manifest(KEY_A) is None
    assert s.keys() == [] and list(s.manifests()) == [] and s.find_keys("a1") == []


def test_published_artifact_is_found_with_its_files(case):
    s = case.store
    publish(s, KEY_A, FILES)
    found = s.lookup(KEY_A)
    assert found.hit and found.damage is None
    m = found.manifest
    assert (m.key, m.metrics.status, m.metrics.op_count, sorted(m.files)) == (
        KEY_A, "PASS", 3, ["model.neff", "model.pt", "sub/extra.bin"])
    folder = s.artifact_dir(KEY_A)
    assert {n: (folder / n).read_bytes() for n in FILES} == FILES
    assert {n: s.blob_size(e.sha256) for n, e in m.files.items()} == {n: len(b) for n, b in FILES.items()}
    assert s.is_complete(KEY_A) and s.is_complete(KEY_A, deep=True)
    assert s.keys() == [KEY_A] and s.find_keys("a1a1") == [KEY_A] and s.find_keys("b2") == []
    assert [x.key for x in s.manifests()] == [KEY_A]


def test_publishing_a_key_twice_keeps_the_first_artifact(case):
    s = case.store
    publish(s, KEY_A, {"model.pt": b"first"})
    publish(s, KEY_A, {"model.pt": b"second, from a builder that lost the race"})
    assert (s.artifact_dir(KEY_A) / "model.pt").read_bytes() == b"first"
    assert s.keys() == [KEY_A]


@pytest.mark.parametrize("name, data, reason", [
    ("model.neff", b"short", "model.neff: blob "),
    ("manifest.json", b'{"key": "gar', "manifest is not valid JSON"),
])
def test_damage_is_found_by_lookup_and_never_served(case, name, data, reason):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, name, data)
    found = s.lookup(KEY_A)
    assert not found.hit and found.manifest is None
    assert found.damage.startswith(reason)
    if name != "manifest.json":
        assert "is 5 bytes, the manifest says 11" in found.damage
        assert found.blob == entry(FILES[name])["sha256"]
    assert not s.is_complete(KEY_A) and s.manifest(KEY_A) is None and list(s.manifests()) == []


def test_a_missing_blob_is_damage(case):
    s = case.store
    publish(s, KEY_A, FILES)
    publish(s, KEY_B, {"model.pt": b"other"})
    s.delete_object(layout.blob_path(entry(FILES["sub/extra.bin"])["sha256"]))
    found = s.lookup(KEY_A)
    assert not found.hit and found.damage.startswith("sub/extra.bin: blob ") and "is missing" in found.damage
    assert s.is_complete(KEY_B)


def test_a_same_size_flip_needs_the_deep_check(case):
    s = case.store
    publish(s, KEY_A, FILES)
    flipped = bytearray(FILES["model.pt"])
    flipped[10] ^= 0xFF
    case.damage(KEY_A, "model.pt", bytes(flipped))
    assert s.lookup(KEY_A).hit
    deep = s.lookup(KEY_A, deep=True)
    assert not deep.hit and deep.damage.startswith("model.pt: blob ") and "hashes to" in deep.damage


def test_an_edited_manifest_fails_its_own_digest(case):
    s = case.store
    publish(s, KEY_A, FILES)
    raw = s.raw_manifest(KEY_A)
    raw["metrics"]["op_count"] = 4
    case.damage(KEY_A, "manifest.json", json.dumps(raw).encode())
    assert s.lookup(KEY_A).damage == "manifest does not match its own sha256 (edited or corrupt)"


def test_an_artifact_is_only_served_under_its_own_key_and_when_it_passed(case):
    s = case.store
    publish(s, KEY_A, FILES, status=Status.ERROR)
    assert s.lookup(KEY_A).damage == "manifest status is ERROR, not PASS"
    key_c = "c3" * 32
    publish(s, KEY_B, FILES)
    publish(s, key_c, FILES)
    case.damage(KEY_B, "manifest.json", json.dumps(s.raw_manifest(key_c)).encode())
    assert s.lookup(KEY_B).damage == "manifest names key 'c3c3c3c3c3c3c3c3', not this entry's key"


def test_reads_do_not_write(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "model.neff", b"x")
    s.put_target(TargetRecord(target="m/b1/fp32/p", key=KEY_A, status=Status.PASS, details={}, time="t"))
    before = case.snapshot()
    s.lookup(KEY_A), s.lookup(KEY_A, deep=True), s.is_complete(KEY_A), s.manifest(KEY_A)
    s.keys(), list(s.manifests()), s.find_keys("a1"), s.target("m/b1/fp32/p"), list(s.targets("m"))
    s.failure("m/b1/fp32/p"), s.results(KEY_A, "validation"), s.channel("m", "dev"), s.history("m", "dev")
    list(s.releases()), list(s.channels()), s.channel_ref("m", "dev"), s.raw_manifest(KEY_A)
    s.blob_size(entry(FILES["model.pt"])["sha256"]), s.get_object(layout.manifest_path(KEY_A))
    s.list_objects("ac")
    assert case.snapshot() == before


def test_repair_moves_damage_out_of_the_way_and_the_key_can_be_published_again(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "model.neff", b"x")
    found = s.repair(KEY_A)
    assert not found.hit and found.damage.startswith("model.neff: blob ") and "is 1 bytes" in found.damage
    assert s.keys() == [] and s.lookup(KEY_A).damage is None  # absent now, no longer damaged
    publish(s, KEY_A, FILES)
    assert s.lookup(KEY_A, deep=True).hit


def test_publishing_over_damage_heals_the_blob(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "model.neff", b"x")
    publish(s, KEY_A, FILES)  # the same bytes again (a deterministic rebuild): the damaged blob is replaced
    assert s.lookup(KEY_A, deep=True).hit
    publish(s, KEY_B, FILES)
    case.damage(KEY_B, "manifest.json", b"{not json")
    publish(s, KEY_B, FILES)  # a damaged manifest in the way is moved aside first
    assert s.lookup(KEY_B, deep=True).hit


def _logs_only(s: ArtifactStore, key: str, files: dict[str, bytes], log: bytes) -> Path:
    """A staging folder of ``key`` sealed with a manifest listing ``files`` that holds only ``worker.log``:
    what a graph reuse hands to publish_as."""
    folder = s.new_staging(key) / "object"
    folder.mkdir()
    (folder / "worker.log").write_bytes(log)
    s.seal(folder, manifest(key, files, logs={"worker.log": log}))
    return folder


def test_publish_as_publishes_a_key_over_another_keys_blobs(case):
    s = case.store
    publish(s, KEY_A, FILES)
    before = {n: e.sha256 for n, e in s.manifest(KEY_A).files.items()}
    folder = _logs_only(s, KEY_B, FILES, b"reused in 0.1 s\n")
    view = s.publish_as(folder, KEY_B, KEY_A)
    assert not folder.exists()
    found = s.lookup(KEY_B, deep=True)
    assert found.hit and {n: e.sha256 for n, e in found.manifest.files.items()} == before
    assert {n: (view / n).read_bytes() for n in FILES} == FILES
    assert s.get_object(layout.log_path(KEY_B, "worker.log")) == b"reused in 0.1 s\n"
    assert s.lookup(KEY_A, deep=True).hit  # the source is untouched


def test_publish_as_refuses_a_damaged_source_blob_another_file_list_and_an_absent_source(case):
    s = case.store
    with pytest.raises(ValueError, match="no complete artifact"):
        s.publish_as(_logs_only(s, KEY_B, FILES, b"log\n"), KEY_B, KEY_A)  # no source at all
    publish(s, KEY_A, FILES)
    with pytest.raises(ValueError, match="no complete artifact with the files"):
        s.publish_as(_logs_only(s, KEY_B, {"model.pt": FILES["model.pt"]}, b"log\n"), KEY_B, KEY_A)
    flipped = bytearray(FILES["model.pt"])
    flipped[3] ^= 0x20
    case.damage(KEY_A, "model.pt", bytes(flipped))  # same size: only the digest tells
    with pytest.raises(ValueError, match="rot or tampering"):
        s.publish_as(_logs_only(s, KEY_B, FILES, b"log\n"), KEY_B, KEY_A)
    assert not s.lookup(KEY_B).hit and s.raw_manifest(KEY_B) is None


def test_quarantine_says_where_it_went_and_nothing_when_absent(case):
    s = case.store
    publish(s, KEY_A, FILES)
    where = s.quarantine(KEY_A, "found rotten by a test")
    assert where and KEY_A in where
    assert s.keys() == [] and s.quarantine(KEY_A, "again") is None


def test_staging_folders_are_fresh_and_private(case):
    s = case.store
    a, b = s.new_staging(KEY_A), s.new_staging(KEY_A)
    assert a != b and a.is_dir() and b.is_dir() and not any(a.iterdir())
    assert s.keys() == []  # nothing staged is an artifact
    assert s.clean_staging() == 0  # both belong to this live process


# -- records -------------------------------------------------------------------------------------

def test_target_records_round_trip_and_replace(case):
    s = case.store
    assert s.target("m/b1/fp32/p") is None
    r1 = TargetRecord(target="m/b1/fp32/p", key=KEY_A, status=Status.PASS, details={"inputs": {"x": 1}},
                      hashes={"inputs": "ab"}, time="2026-12-01T00:00:00+00:00")
    s.put_target(r1)
    assert s.target("m/b1/fp32/p") == r1
    r2 = TargetRecord(target="m/b1/fp32/p", key=KEY_B, status=Status.ERROR, details={}, time="later")
    s.put_target(r2)
    s.put_target(TargetRecord(target="m/b8/fp32/p", key=KEY_A, status=Status.PASS, details={}))
    s.put_target(TargetRecord(target="other/b1/fp32/p", key=KEY_A, status=Status.PASS, details={}))
    assert s.target("m/b1/fp32/p") == r2
    assert [r.target for r in s.targets("m")] == ["m/b1/fp32/p", "m/b8/fp32/p"]
    assert [r.target for r in s.targets("m", "b8")] == ["m/b8/fp32/p"]
    assert sorted(r.target for r in s.all_targets()) == ["m/b1/fp32/p", "m/b8/fp32/p", "other/b1/fp32/p"]


def test_failure_records_keep_their_log_and_are_cleared(case):
    s = case.store
    rec = FailureRecord(target="m/b1/fp32/p", key=KEY_A, status=Status.TIMEOUT, reason="stopped after 5 s",
                        compile_time_s=5.0, peak_rss_bytes=2**20, exit_code=None, attempts=1, attempts_total=2,
                        details={"stage": "compile"}, time="t")
    s.put_failure(rec, b"the log\n")
    assert s.failure("m/b1/fp32/p") == rec
    assert s.failure_log("m/b1/fp32/p").read_bytes() == b"the log\n"
    assert [f.key for f in s.failures("m", "b1")] == [KEY_A] and list(s.failures("m", "b8")) == []
    s.clear_failure("m/b1/fp32/p")
    assert s.failure("m/b1/fp32/p") is None and list(s.failures("m")) == []
    s.clear_failure("m/b1/fp32/p")  # clearing twice is fine


def test_failure_record_json_keeps_its_field_order():
    rec = FailureRecord(target="t", key=KEY_A, status=Status.ERROR, reason="r", attempts_total=3, time="x")
    assert list(rec.to_json()) == ["target", "key", "status", "compile_time_s", "peak_rss_bytes", "exit_code",
                                   "attempts", "reason", "attempts_total", "details", "time"]
    assert "attempts_total" not in FailureRecord(target="t", key=KEY_A, status=Status.ERROR).to_json()
    assert FailureRecord.from_json({"status": "ERROR"}) is None and TargetRecord.from_json([1]) is None


def test_results_are_kept_per_kind_and_name(case):
    s = case.store
    assert s.result(KEY_A, "validation", "cpu") is None and s.results(KEY_A, "validation") == {}
    s.put_result(KEY_A, "validation", "cpu", {"verdict": "pass"})
    s.put_result(KEY_A, "validation", "cuda", {"verdict": "fail"})
    s.put_result(KEY_A, "bench", "cpu--h", {"p50": 1.0})
    s.put_result(KEY_A, "validation", "cpu", {"verdict": "fail", "reason": "again"})
    assert s.result(KEY_A, "validation", "cpu") == {"verdict": "fail", "reason": "again"}
    assert s.results(KEY_A, "validation") == {"cpu": {"verdict": "fail", "reason": "again"},
                                              "cuda": {"verdict": "fail"}}
    assert list(s.results(KEY_A, "bench")) == ["cpu--h"]


# -- releases and channels -------------------------------------------------------------------------

def test_release_records_are_written_once(case):
    s = case.store
    assert s.release("m", "r-00aa") is None and s.release_ids("m") == []
    assert s.put_release("m", "r-00aa11", {"id": "r-00aa11", "n": 1}) is True
    assert s.put_release("m", "r-00aa11", {"id": "r-00aa11", "n": 2}) is False
    assert s.release("m", "r-00aa11") == {"id": "r-00aa11", "n": 1}
    s.put_release("m", "r-00bb22", {"id": "r-00bb22"})
    s.put_release("n", "r-00cc33", {"id": "r-00cc33"})
    assert s.release_ids("m") == ["r-00aa11", "r-00bb22"] and s.release_ids("m", "r-00b") == ["r-00bb22"]
    assert [(m, r) for m, r, _ in s.releases()] == [("m", "r-00aa11"), ("m", "r-00bb22"), ("n", "r-00cc33")]
    assert [r for _, r, _ in s.releases("n")] == ["r-00cc33"]


def test_channels_move_by_compare_and_swap(case):
    s = case.store
    assert s.channel("m", "dev") is None and s.history("m", "dev") == [] and list(s.channels()) == []
    assert s.channel_ref("m", "dev") == (None, None)
    assert s.swap_channel("m", "dev", {"release": "r-1", "version": 1}, None) is True
    assert s.swap_channel("m", "dev", {"release": "r-x", "version": 1}, None) is False  # not empty any more
    ptr, token = s.channel_ref("m", "dev")
    assert ptr == {"release": "r-1", "version": 1} and isinstance(token, str) and token
    assert s.swap_channel("m", "dev", {"release": "r-2", "version": 2}, token) is True
    assert s.swap_channel("m", "dev", {"release": "r-3", "version": 2}, token) is False  # a stale token loses
    ptr2, token2 = s.channel_ref("m", "dev")
    assert ptr2 == {"release": "r-2", "version": 2} and token2 != token
    assert s.channel("m", "dev") == ptr2
    assert [(m, c, p["version"]) for m, c, p in s.channels()] == [("m", "dev", 2)]


def test_of_two_racing_swaps_exactly_one_wins(case):
    s = case.store
    s.swap_channel("m", "prod", {"release": "r-0", "version": 0}, None)
    _, token = s.channel_ref("m", "prod")
    start, wins = threading.Barrier(8), []

    def racer(i: int) -> None:
        start.wait(10)
        if s.swap_channel("m", "prod", {"release": f"r-{i}", "version": 1}, token):
            wins.append(i)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and s.channel("m", "prod")["release"] == f"r-{wins[0]}"


def test_history_entries_of_two_writers_are_all_kept_in_order(case):
    s = case.store
    s.append_history("m", "dev", {"action": "promote", "to": "r-1"})
    time.sleep(0.002)
    s.append_history("m", "dev", {"action": "promote", "to": "r-2"})
    assert [e["to"] for e in s.history("m", "dev")] == ["r-1", "r-2"]

    def writer(name: str) -> None:
        for i in range(20):
            s.append_history("m", "qa", {"action": "promote", "to": f"{name}-{i}"})

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hist = [e["to"] for e in s.history("m", "qa")]
    assert sorted(hist) == sorted(f"{n}-{i}" for n in "ab" for i in range(20))
    assert [h for h in hist if h.startswith("a-")] == [f"a-{i}" for i in range(20)]  # each writer's own order
    assert s.history("m", "dev")[-1]["to"] == "r-2"  # another channel's history is its own


# -- blobs, manifests and objects one by one ----------------------------------------------------------

def test_blobs_are_create_only_and_an_intact_blob_is_kept(case, tmp_path):
    s = case.store
    src = tmp_path / "src.bin"
    src.write_bytes(b"blob content" * 10)
    sha = entry(src.read_bytes())["sha256"]
    assert s.blob_size(sha) is None
    assert s.put_blob(sha, src) is True and s.blob_size(sha) == 120
    assert s.put_blob(sha, src) is False  # intact: kept, nothing written
    with pytest.raises(ValueError):
        s.put_blob("00" * 32, src)  # the bytes do not hash to that name
    assert s.blob_size("00" * 32) is None
    out = tmp_path / "out" / "copy.bin"
    s.get_blob(sha, out)
    assert out.read_bytes() == src.read_bytes()
    with pytest.raises(FileNotFoundError):
        s.get_blob("11" * 32, tmp_path / "absent.bin")
    assert not (tmp_path / "absent.bin").exists()


def test_a_damaged_blob_is_refused_by_get_blob_and_replaced_by_put_blob(case, tmp_path):
    s = case.store
    publish(s, KEY_A, FILES)
    sha = entry(FILES["model.pt"])["sha256"]
    flipped = bytearray(FILES["model.pt"])
    flipped[3] ^= 0x20
    case.damage(KEY_A, "model.pt", bytes(flipped))  # same size: only the digest tells
    with pytest.raises(ValueError):
        s.get_blob(sha, tmp_path / "model.pt")
    assert not (tmp_path / "model.pt").exists()
    src = tmp_path / "again.pt"
    src.write_bytes(FILES["model.pt"])
    assert s.put_blob(sha, src) is True  # damaged: replaced, and every manifest listing it heals
    s.get_blob(sha, tmp_path / "model.pt")
    assert (tmp_path / "model.pt").read_bytes() == FILES["model.pt"] and s.lookup(KEY_A, deep=True).hit


def test_manifests_are_create_only(case, tmp_path):
    s = case.store
    assert s.raw_manifest(KEY_A) is None
    src = tmp_path / "m.pt"
    src.write_bytes(b"model")
    s.put_blob(entry(b"model")["sha256"], src)
    raw = manifest(KEY_A, {"model.pt": b"model"}).model_dump(mode="json")
    from neuron_build.store.digests import SELF_DIGEST, manifest_digest
    raw[SELF_DIGEST] = manifest_digest(raw)  # sealed: a manifest without its own digest is not trusted
    assert s.put_manifest(KEY_A, raw) is True
    assert s.lookup(KEY_A).hit and s.keys() == [KEY_A]
    other = dict(raw, host="another builder")
    assert s.put_manifest(KEY_A, other) is False
    assert s.raw_manifest(KEY_A) == raw


def test_logs_are_kept_beside_the_artifact_and_not_pinned(case):
    s = case.store
    publish(s, KEY_A, {"model.pt": b"model"}, logs={"worker.log": b"took 3 s at 10:00\n"})
    m = s.manifest(KEY_A)
    assert list(m.files) == ["model.pt"] and list(m.logs) == ["worker.log"]
    assert s.get_object(layout.log_path(KEY_A, "worker.log")) == b"took 3 s at 10:00\n"
    # a rebuild whose log differs is the same artifact: the first one's manifest stays
    publish(s, KEY_A, {"model.pt": b"model"}, logs={"worker.log": b"took 4 s at 11:00\n"})
    assert s.raw_manifest(KEY_A)["logs"]["worker.log"]["size"] == len(b"took 3 s at 10:00\n")


def test_objects_round_trip(case):
    s = case.store
    path = "leases/" + KEY_A + ".json"
    assert s.get_object(path) is None and s.list_objects("leases") == []
    assert s.put_object(path, b"one") is True and s.get_object(path) == b"one"
    assert s.put_object(path, b"two") is True and s.get_object(path) == b"two"
    assert s.put_object(path, b"three", create_only=True) is False and s.get_object(path) == b"two"
    assert s.put_object("leases/sub/x.json", b"x", create_only=True) is True
    assert s.list_objects("leases") == [path, "leases/sub/x.json"]
    assert s.delete_object(path) is True and s.delete_object(path) is False
    assert s.get_object(path) is None and s.list_objects("leases") == ["leases/sub/x.json"]


# -- the graph index (the second level of the key) ---------------------------------------------------

def test_graph_index_entries_round_trip_first_writer_wins_and_damage_is_a_miss(case):
    from neuron_build.store import graph_index
    s = case.store
    gk, gk2 = "c3" * 32, "d4" * 32
    assert graph_index.lookup(s, gk) is None and graph_index.known(s) == []
    first = graph_index.GraphEntry(graph_key=gk, key=KEY_A, target="m/b1/fp32/p", backend="torchscript",
                                   time="2026-12-01T00:00:00+00:00")
    assert graph_index.record(s, first) is True
    assert s.get_object(layout.graph_path(gk)) is not None and layout.graph_path(gk) == f"graphs/c3/{gk}.json"
    assert graph_index.record(s, graph_index.GraphEntry(graph_key=gk, key=KEY_B)) is False  # first one kept
    assert graph_index.lookup(s, gk) == first
    assert graph_index.record(s, graph_index.GraphEntry(graph_key=gk, key=KEY_B), replace=True) is True
    assert graph_index.lookup(s, gk).key == KEY_B
    graph_index.record(s, graph_index.GraphEntry(graph_key=gk2, key=KEY_A))
    assert graph_index.known(s) == [gk, gk2]
    assert [e.key for e in graph_index.entries(s)] == [KEY_B, KEY_A]
    # untrusted input: an entry naming another graph key, a key that is no digest, or garbage is a miss
    s.put_object(layout.graph_path(gk2), json.dumps({"graph_key": gk, "key": KEY_A}).encode())
    assert graph_index.lookup(s, gk2) is None
    s.put_object(layout.graph_path(gk2), json.dumps({"graph_key": gk2, "key": "../../etc"}).encode())
    assert graph_index.lookup(s, gk2) is None
    s.put_object(layout.graph_path(gk2), b"{not json")
    assert graph_index.lookup(s, gk2) is None and graph_index.lookup(s, "../x") is None
    with pytest.raises(ValueError, match="64 hex"):
        graph_index.record(s, graph_index.GraphEntry(graph_key="nope", key=KEY_A))
    assert "graphs" in layout.SHARED_AREAS


# -- builders sharing the store ----------------------------------------------------------------------

def test_a_key_lock_makes_the_second_builder_wait(case):
    s = case.store
    order: list[str] = []
    first_in = threading.Event()

    def first():
        with s.key_lock(KEY_A, target="t1", heartbeat_s=60):
            first_in.set()
            time.sleep(0.5)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    assert first_in.wait(10)
    lock = s.key_lock(KEY_A, target="t2", heartbeat_s=60)
    with lock:
        order.append("second in")
    t.join()
    assert order == ["first done", "second in"]
    assert lock.waited_s >= 0.2 and (lock.waited_for or {}).get("target") == "t1"


def test_an_unbounded_memory_budget_admits_at_once(case):
    with case.store.memory_budget(None).reserve(10**12, "huge") as info:
        assert info == {"waited_s": 0.0, "in_use_bytes": 0}


def test_the_local_store_implements_every_protocol(tmp_path):
    s = LocalStore(tmp_path)
    assert all(isinstance(s, p) for p in (ActionCache, RecordStore, ReleaseStore, Coordination, ObjectIO,
                                          ArtifactStore))
    assert not isinstance(object(), ActionCache)
