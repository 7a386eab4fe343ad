"""Channels agree across the local and the remote store (issue 20, item 5).

Two hosts promote into one channel at once through a flaky network: each host's first swap is applied
by the store and then its answer is lost (a connection reset after the write). The lost answer is
simulated at the medium level (a medium that applies the write, then raises ``ConnectionResetError``,
which the wire mapping turns into a store error as a reset on a real socket would): the TCP fault proxy
is built in parallel (issue 20, item 4). Both promotions are reported done, the history is one unbroken
chain, and a rollback goes back to the release the channel held before.

A project with local channels that adds a remote is refused a promotion through the pair until
``push --all`` shared its channels (with their history); fetch copies history before pointers.
"""

from __future__ import annotations

import threading

import pytest

from neuron_build.errors import UserError
from neuron_build.release.channels import promote, release_stack, rollback
from neuron_build.release.records import channel_history, channel_pointer, get_history
from neuron_build.store import LocalStore
from neuron_build.store.remote import RemoteStore
from neuron_build.store.sync import SyncReport, copy_channels
from neuron_build.store.tiered import ReadThroughStore
from tests.helpers.releases import ctx, make


def lose_first_answer(store: RemoteStore) -> list[str]:
    """Make the first channel swap of ``store`` be applied and then fail as a reset connection."""
    real, lost = store.io._swap, []

    def swap(rel, data, expected):
        done = real(rel, data, expected)
        if done and rel.startswith("channels/") and not lost:
            lost.append(rel)
            raise ConnectionResetError(104, "Connection reset by peer (after the server applied the write)")
        return done

    store.io._swap = swap
    return lost


def _host(tmp_path, name: str, url: str) -> ReadThroughStore:
    return ReadThroughStore(LocalStore(tmp_path / name / "artifacts"), RemoteStore(url, cache_dir=tmp_path / name / "c"))


def test_two_hosts_promote_through_lost_answers_into_one_unbroken_history(proj, tmp_path):
    project, _, local, settings = ctx(proj)
    url = f"file://{tmp_path}/shared"
    r1, r2 = make(proj), make(proj, "bf16")
    setup = ReadThroughStore(local, RemoteStore(url, cache_dir=tmp_path / "setup"))
    for r in (r1, r2):
        assert setup.put_release("tiny", r["id"], r)  # pushes the artifacts, then the record
    hosts = [_host(tmp_path, n, url) for n in ("hostA", "hostB")]
    lost = [lose_first_answer(h.remote) for h in hosts]
    barrier = threading.Barrier(2)
    results, errors = {}, []

    def run(host, rel) -> None:
        try:
            results[rel["id"]] = promote(host, settings, "tiny", "dev", release=rel["id"], allow_unvalidated=True,
                                         reason="two hosts", before_swap=lambda: barrier.wait(timeout=60))
        except Exception as e:  # the test reports it
            errors.append(e)

    threads = [threading.Thread(target=run, args=(h, r)) for h, r in zip(hosts, (r1, r2), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and sorted(results) == sorted([r1["id"], r2["id"]])
    assert all(lost), "every host's first swap lost its answer"
    shared = setup.remote
    hist = channel_history(shared, "tiny", "dev")
    assert [h["action"] for h in hist] == ["promote", "promote"]  # both recorded, nothing refused
    first, second = hist
    assert (first["from"], first["version"]) == (None, 1)
    assert (second["from"], second["version"]) == (first["to"], 2)  # one chain: each from is the last to
    assert {first["op"], second["op"]} == {results[first["to"]].extra["op"], results[second["to"]].extra["op"]}
    ptr = channel_pointer(shared, "tiny", "dev")
    assert (ptr["release"], ptr["version"], ptr["op"]) == (second["to"], 2, second["op"])
    assert release_stack(get_history(shared, "tiny", "dev")) == [first["to"], second["to"]]
    # a rollback (through a lost answer too) goes back to the release held before, and is recorded
    again = _host(tmp_path, "hostC", url)
    lose_first_answer(again.remote)
    back = rollback(again, settings, "tiny", "dev", reason="back")
    assert (back["from"], back["to"], back["version"]) == (second["to"], first["to"], 3)
    assert [h["action"] for h in channel_history(shared, "tiny", "dev")] == ["promote", "promote", "rollback"]
    assert channel_pointer(shared, "tiny", "dev")["release"] == first["to"]


def test_local_channels_are_shared_by_push_before_the_pair_promotes(proj, tmp_path):
    project, _, local, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(local, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="before the remote")
    remote = RemoteStore(f"file://{tmp_path}/shared", cache_dir=tmp_path / "c")
    pair = ReadThroughStore(local, remote)
    for r in (r1, r2):  # what push copies before the channels: the releases (and their artifacts)
        assert pair.put_release("tiny", r["id"], r)
    with pytest.raises(UserError) as e:
        promote(pair, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="after")
    msg = str(e.value)
    assert "\n" not in msg and local.location in msg and remote.location in msg and "push --all" in msg
    assert channel_pointer(remote, "tiny", "dev") is None  # nothing moved

    rep = SyncReport()
    copy_channels(local, remote, rep)  # what `push` (and `push --all`) do
    assert rep.disagree == [] and channel_history(remote, "tiny", "dev") == channel_history(local, "tiny", "dev")
    e2 = promote(pair, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="after")
    assert e2.version == 2
    for s in (local, remote):  # the local mirror agrees with the remote: pointer and history
        assert channel_pointer(s, "tiny", "dev")["release"] == r2["id"]
        assert [h["to"] for h in channel_history(s, "tiny", "dev")] == [r1["id"], r2["id"]]

    # a channel moved on the local store alone now disagrees: push refuses it in one line naming both
    promote(local, settings, "tiny", "staging", from_channel="dev", allow_unvalidated=True, reason="local only")
    remote.put_history_entry("tiny", "staging", {"action": "promote", "to": r1["id"], "version": 1})
    remote.swap_channel("tiny", "staging", {"release": r1["id"], "version": 1}, None)
    rep = SyncReport()
    copy_channels(local, remote, rep)
    assert len(rep.disagree) == 1 and "tiny/staging" in rep.disagree[0] and "\n" not in rep.disagree[0]
    assert local.location in rep.disagree[0] and remote.location in rep.disagree[0]
    assert channel_pointer(remote, "tiny", "staging")["release"] == r1["id"]  # left as it was


def test_promote_from_a_local_channel_before_push_names_both_stores_and_push(proj, tmp_path):
    """`promote --from dev --to staging` after adding a remote, before `push`: the local store holds dev, the
    remote does not; not "holds no release yet" (false) but the one line docs/store.md promises."""
    project, _, local, settings = ctx(proj)
    r1 = make(proj)
    promote(local, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="before the remote")
    remote = RemoteStore(f"file://{tmp_path}/shared", cache_dir=tmp_path / "c")
    pair = ReadThroughStore(local, remote)
    assert pair.put_release("tiny", r1["id"], r1)
    with pytest.raises(UserError) as e:
        promote(pair, settings, "tiny", "staging", from_channel="dev", allow_unvalidated=True, reason="after")
    msg = str(e.value)
    assert "holds no release yet" not in msg and "\n" not in msg
    assert "channel tiny/dev" in msg and local.location in msg and remote.location in msg and "push --all" in msg
    assert channel_pointer(remote, "tiny", "staging") is None
