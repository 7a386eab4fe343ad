"""The read-through pair's home tiers: what it takes from :class:`~neuron_build.store.core.Store` must land
in the right store. Failure records are this host's (the local store only); releases, channels and their
history are the ones every host shares (the remote's, whatever the local mirror holds); target records and
results are written to both and read here first. The contract suite (test_contract.py) checks the pair
behaves as a store; these check *which* store answers."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from neuron_build.status import Status
from neuron_build.store import LocalStore, layout
from neuron_build.store.core import Store
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.store.remote import RemoteStore
from neuron_build.store.tiered import ReadThroughStore
from neuron_build.util import json_bytes
from tests.helpers.store import FILES, KEY_A, KEY_B, publish

TID = "m/b1/fp32/p"


@pytest.fixture
def pair(tmp_path: Path) -> ReadThroughStore:
    remote = RemoteStore(f"memory://tiered-{secrets.token_hex(4)}", cache_dir=tmp_path / "cache")
    return ReadThroughStore(LocalStore(tmp_path / "local"), remote)


def test_failure_records_stay_on_this_host(pair):
    rec = FailureRecord(target=TID, key=KEY_A, status=Status.ERROR, reason="neuronx-cc exited 70", time="t")
    pair.put_failure(rec, b"the log\n")
    assert pair.local.failure(TID) == rec and pair.remote.failure(TID) is None
    assert pair.remote.list_objects(layout.targets_dir()) == []  # neither the record nor its log went there
    assert pair.failure(TID) == rec and [f.key for f in pair.failures("m")] == [KEY_A]
    assert pair.failure_log(TID).read_bytes() == b"the log\n"
    # a failure record on the remote (another host's) is not this host's
    other = FailureRecord(target="m/b8/fp32/p", key=KEY_B, status=Status.TIMEOUT, reason="r", time="t")
    pair.remote.put_failure(other, b"theirs\n")
    assert pair.failure("m/b8/fp32/p") is None and [f.target for f in pair.failures("m")] == [TID]
    pair.clear_failure(TID)
    assert pair.local.failure(TID) is None and pair.remote.failure("m/b8/fp32/p") == other


def test_releases_channels_and_history_are_the_remotes(pair):
    publish(pair, KEY_A, FILES)
    rel = {"id": "r-1", "artifacts": [{"target": TID, "key": KEY_A, "files": {}}]}
    assert pair.put_release("m", "r-1", rel)
    assert pair.remote.release("m", "r-1") == rel and pair.local.release("m", "r-1") is None
    # a release and a channel only in the local store (a stale mirror, or made before the remote) are not read
    pair.local.put_release("m", "r-local", {"id": "r-local", "artifacts": []})
    pair.local.put_object(layout.channel_path("m", "prod"), json_bytes({"release": "r-local", "version": 9}))
    assert pair.release("m", "r-local") is None and pair.release("m", "r-1") == rel
    assert pair.release_ids("m") == ["r-1"] and [(m, r) for m, r, _ in pair.releases()] == [("m", "r-1")]
    assert pair.channel("m", "prod") is None and list(pair.channels()) == []
    assert pair.remote.swap_channel("m", "dev", {"release": "r-1", "version": 1}, None)
    assert pair.channel("m", "dev") == {"release": "r-1", "version": 1}
    assert pair.channel_ref("m", "dev") == pair.remote.channel_ref("m", "dev")
    assert [(m, c) for m, c, _ in pair.channels()] == [("m", "dev")]
    pair.append_history("m", "dev", {"action": "promote", "to": "r-1", "op": "0123456789abcdef"})
    assert [e["to"] for e in pair.history("m", "dev")] == ["r-1"]
    assert [e["to"] for e in pair.remote.history("m", "dev")] == ["r-1"]
    assert [e["to"] for e in pair.local.history("m", "dev")] == ["r-1"]  # the local mirror holds the same object


def test_target_records_and_results_go_to_both_and_are_read_here_first(pair):
    rec = TargetRecord(target=TID, key=KEY_A, status=Status.PASS, details={})
    pair.put_target(rec)
    assert pair.local.target(TID) == rec and pair.remote.target(TID) == rec
    theirs = TargetRecord(target=TID, key=KEY_B, status=Status.PASS, details={})
    pair.remote.put_target(theirs)
    assert pair.target(TID) == rec  # here first
    pair.remote.put_target(TargetRecord(target="m/b8/fp32/p", key=KEY_B, status=Status.PASS, details={}))
    assert pair.target("m/b8/fp32/p").key == KEY_B  # then the remote
    pair.put_result(KEY_A, "validation", "cpu", {"verdict": "PASS"})
    assert pair.remote.result(KEY_A, "validation", "cpu") == {"verdict": "PASS"}
    assert pair.result(KEY_A, "validation", "cpu") == {"verdict": "PASS"}
    assert pair.result(KEY_B, "validation", "cpu") is None


def test_the_pair_declares_only_what_tiering_changes():
    """What a store does the same way on either tier (staging, sealing, the memory budget, the blob write of
    a publish, the history append, the records with a home tier) is Store's, not a delegation of the pair."""
    inherited = {"seal", "new_staging", "clean_staging", "memory_budget", "put_blob", "is_complete", "manifest",
                 "raw_manifest", "append_history", "put_target", "target", "put_result", "result", "put_failure",
                 "failure", "failures", "clear_failure", "release", "release_ids", "releases", "channel",
                 "channels", "channel_ref", "history"}
    assert issubclass(ReadThroughStore, Store)
    assert inherited & set(vars(ReadThroughStore)) == set()
    assert all(callable(getattr(ReadThroughStore, n)) for n in inherited)
