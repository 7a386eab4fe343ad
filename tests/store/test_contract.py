"""The store contract (``neuron_build/store/contract.py``), one suite for every implementation.

Each implementation is a fixture case: the store itself, plus two hooks the suite needs from outside
the contract: ``damage(key, name, data)`` (overwrite one file of a published artifact, as rot or a
tamperer would) and ``snapshot()`` (everything the store holds, to prove that reads do not write).
The shared-store issue adds its remote implementations as further cases here.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import pytest
from filelock import Timeout

from neuron_build.status import Status
from neuron_build.store import ArtifactStore, LocalStore
from neuron_build.store.contract import ActionCache, Coordination, RecordStore, ReleaseStore
from neuron_build.store.manifest import Manifest, Metrics
from neuron_build.store.records import FailureRecord, TargetRecord

KEY_A = "a1" * 32
KEY_B = "b2" * 32


class Case:
    """One implementation under test with its out-of-contract hooks."""

    def __init__(self, store: ArtifactStore, damage, snapshot):
        self.store, self.damage, self.snapshot = store, damage, snapshot


def _local(tmp_path: Path) -> Case:
    store = LocalStore(tmp_path / "store")

    def damage(key: str, name: str, data: bytes) -> None:
        (store.object_dir(key) / name).write_bytes(data)

    def snapshot() -> list[tuple[str, int, bytes]]:
        root = store.root
        if not root.exists():
            return []
        return sorted((p.relative_to(root).as_posix(), p.stat().st_size, p.read_bytes())
                      for p in root.rglob("*") if p.is_file())

    return Case(store, damage, snapshot)


IMPLEMENTATIONS = {"local": _local}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def case(request, tmp_path) -> Case:
    return IMPLEMENTATIONS[request.param](tmp_path)


def manifest(key: str, files: dict[str, bytes], status: str = Status.PASS, target: str = "m/b1/fp32/p") -> Manifest:
    """A manifest listing ``files`` by sha256 and size."""
    return Manifest(
        key=key, target=target, model="m", bucket={"batch": 1}, dtype="fp32", profile="p", backend="torchscript",
        hardware_target="cpu", key_details={}, component_hashes={},
        files={n: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for n, b in files.items()},
        metrics=Metrics(status=status, compile_time_s=1.5, op_count=3, op_count_source="test",
                        artifact_bytes=sum(map(len, files.values()))),
        toolchain={"torch": "0"}, created="2026-12-01T00:00:00+00:00", host="test")


def publish(store: ArtifactStore, key: str, files: dict[str, bytes], **kw) -> Path:
    """Stage, seal and publish an artifact the way the builder does."""
    folder = store.new_staging(key) / "object"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    store.seal(folder, manifest(key, files, **kw))
    return store.publish(folder, key)


FILES = {"model.pt": b"weights" * 100, "worker.log": b"compiled\n", "sub/extra.bin": b"\x00\x01"}


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
        KEY_A, "PASS", 3, ["model.pt", "sub/extra.bin", "worker.log"])
    folder = s.artifact_dir(KEY_A)
    assert {n: (folder / n).read_bytes() for n in FILES} == FILES
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
    ("worker.log", b"short", "worker.log is 5 bytes, manifest.json says 9"),
    ("manifest.json", b'{"key": "gar', "manifest.json is not valid JSON"),
    ("extra.txt", b"not listed", "extra.txt is not listed in manifest.json"),
])
def test_damage_is_found_by_lookup_and_never_served(case, name, data, reason):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, name, data)
    found = s.lookup(KEY_A)
    assert not found.hit and found.manifest is None
    assert found.damage.startswith(reason)
    assert not s.is_complete(KEY_A) and s.manifest(KEY_A) is None and list(s.manifests()) == []


def test_a_same_size_flip_needs_the_deep_check(case):
    s = case.store
    publish(s, KEY_A, FILES)
    flipped = bytearray(FILES["model.pt"])
    flipped[10] ^= 0xFF
    case.damage(KEY_A, "model.pt", bytes(flipped))
    assert s.lookup(KEY_A).hit
    deep = s.lookup(KEY_A, deep=True)
    assert not deep.hit and deep.damage.startswith("model.pt sha256 is ")


def test_an_edited_manifest_fails_its_own_digest(case):
    s = case.store
    publish(s, KEY_A, FILES)
    text = (s.artifact_dir(KEY_A) / "manifest.json").read_text().replace('"op_count": 3', '"op_count": 4')
    case.damage(KEY_A, "manifest.json", text.encode())
    assert s.lookup(KEY_A).damage == "manifest.json does not match its own sha256 (edited or corrupt)"


def test_an_artifact_is_only_served_under_its_own_key_and_when_it_passed(case):
    s = case.store
    publish(s, KEY_A, FILES, status=Status.ERROR)
    assert s.lookup(KEY_A).damage == "manifest status is ERROR, not PASS"
    key_c = "c3" * 32
    publish(s, KEY_B, FILES)
    publish(s, key_c, FILES)
    case.damage(KEY_B, "manifest.json", (s.artifact_dir(key_c) / "manifest.json").read_bytes())
    assert s.lookup(KEY_B).damage == "manifest.json names key 'c3c3c3c3c3c3c3c3', not this object's key"


def test_reads_do_not_write(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "worker.log", b"x")
    s.put_target(TargetRecord(target="m/b1/fp32/p", key=KEY_A, status=Status.PASS, details={}, time="t"))
    before = case.snapshot()
    s.lookup(KEY_A), s.lookup(KEY_A, deep=True), s.is_complete(KEY_A), s.manifest(KEY_A)
    s.keys(), list(s.manifests()), s.find_keys("a1"), s.target("m/b1/fp32/p"), list(s.targets("m"))
    s.failure("m/b1/fp32/p"), s.results(KEY_A, "validation"), s.channel("m", "dev"), s.history("m", "dev")
    list(s.releases()), list(s.channels())
    assert case.snapshot() == before


def test_repair_moves_damage_out_of_the_way_and_the_key_can_be_published_again(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "worker.log", b"x")
    found = s.repair(KEY_A)
    assert not found.hit and found.damage.startswith("worker.log is 1 bytes")
    assert s.keys() == [] and s.lookup(KEY_A).damage is None  # absent now, no longer damaged
    publish(s, KEY_A, FILES)
    assert s.lookup(KEY_A, deep=True).hit


def test_publishing_over_damage_quarantines_it_first(case):
    s = case.store
    publish(s, KEY_A, FILES)
    case.damage(KEY_A, "worker.log", b"x")
    publish(s, KEY_A, FILES)
    assert s.lookup(KEY_A, deep=True).hit


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


def test_channels_move_under_their_lock_and_keep_a_history(case):
    s = case.store
    assert s.channel("m", "dev") is None and s.history("m", "dev") == [] and list(s.channels()) == []
    with s.channel_lock("m", "dev", timeout_s=5):
        s.set_channel("m", "dev", {"release": "r-1", "version": 1})
        s.append_history("m", "dev", {"action": "promote", "to": "r-1"})
    with s.channel_lock("m", "dev", timeout_s=5):
        s.set_channel("m", "dev", {"release": "r-2", "version": 2})
        s.append_history("m", "dev", {"action": "promote", "to": "r-2"})
    assert s.channel("m", "dev") == {"release": "r-2", "version": 2}
    assert [e["to"] for e in s.history("m", "dev")] == ["r-1", "r-2"]
    assert [(m, c, p["version"]) for m, c, p in s.channels()] == [("m", "dev", 2)]


def test_a_channel_lock_is_exclusive(case):
    s = case.store
    held, release = threading.Event(), threading.Event()

    def holder():
        with s.channel_lock("m", "prod", timeout_s=5):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    t0 = time.monotonic()
    with pytest.raises(Timeout):
        with s.channel_lock("m", "prod", timeout_s=0.3):
            pass
    assert time.monotonic() - t0 >= 0.3
    release.set()
    t.join()
    with s.channel_lock("m", "prod", timeout_s=1):
        pass


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
    assert all(isinstance(s, p) for p in (ActionCache, RecordStore, ReleaseStore, Coordination, ArtifactStore))
    assert not isinstance(object(), ActionCache)
