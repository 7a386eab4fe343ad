"""The graph key's compile lock (:mod:`neuron_build.build.graph.gate`), against a folder store, with the worker's
side played by files: a worker that asks gets "compile" when it holds the lock, a second one for the same graph
waits until the first is done, a gate closed while it waits takes nothing, a worker that does not ask is not
answered."""

from __future__ import annotations

import json
import time
from pathlib import Path

import structlog

from neuron_build.build.graph.gate import LOCK_PREFIX, GraphGate
from neuron_build.compilers import graph_key
from neuron_build.store.local import LocalStore

GK = "ab" * 32


def ask(work: Path, asks: bool = True, gk: str = GK) -> None:
    work.mkdir(parents=True, exist_ok=True)
    (work / graph_key.GRAPH_FILE).write_text(json.dumps({"graph_key": gk, "document": "cd" * 32, "asks": asks}))


def verdict(work: Path, wait_s: float = 10.0) -> dict | None:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            return json.loads((work / graph_key.VERDICT_FILE).read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
    return None


def gate(store: LocalStore, work: Path, target: str) -> GraphGate:
    work.mkdir(parents=True, exist_ok=True)
    return GraphGate(store, work, target, heartbeat_s=60, log=structlog.get_logger()).start()


def test_the_second_builder_of_a_graph_waits_for_the_first(tmp_path):
    store = LocalStore(tmp_path / "store")
    a, b = tmp_path / "a", tmp_path / "b"
    ga = gate(store, a, "m1/static/fp32/p1")
    ask(a)
    assert verdict(a) == {"hit": False}  # no entry in the index: compile, holding the lock
    assert (tmp_path / "store" / "locks" / f"{LOCK_PREFIX}{GK}.lock").exists()
    gb = gate(store, b, "m2/static/fp32/p1")
    ask(b)
    assert verdict(b, wait_s=1.0) is None  # waits while the first compiles
    ga.close()
    assert verdict(b) == {"hit": False}  # the first published nothing: the second compiles
    assert gb.graph_key == GK and gb.waited_s > 0.5
    gb.close()


def test_a_gate_closed_while_it_waits_holds_nothing(tmp_path):
    store = LocalStore(tmp_path / "store")
    a, b = tmp_path / "a", tmp_path / "b"
    ga = gate(store, a, "m1/static/fp32/p1")
    ask(a)
    assert verdict(a) == {"hit": False}
    gb = gate(store, b, "m2/static/fp32/p1")
    ask(b)
    time.sleep(0.5)
    gb.close()  # (the worker ended: timed out, killed)
    assert verdict(b, wait_s=0.3) is None and gb._lock is None
    ga.close()
    lock = store.key_lock(LOCK_PREFIX + GK)
    lock.acquire()  # free again
    lock.release()


def test_a_worker_that_does_not_ask_is_not_answered(tmp_path):
    store = LocalStore(tmp_path / "store")
    a = tmp_path / "a"
    ga = gate(store, a, "m1/static/fp32/p1")
    ask(a, asks=False)  # the listed index held the key, or reuse is off
    assert verdict(a, wait_s=0.5) is None
    ga.close()
    assert ga.graph_key is None and not (tmp_path / "store" / "locks" / f"{LOCK_PREFIX}{GK}.lock").exists()


def test_two_hosts_on_one_remote_share_the_graph_keys_lease(tmp_path, s3_bucket):
    """Two hosts (two local stores, one S3 remote): the second host's gate waits on the remote's lease of the
    graph key (``leases/graph-<graph key>.json``) while the first host holds it."""
    from neuron_build.store import cached_store

    url = f"s3://{s3_bucket}/cache"
    host1, host2 = (cached_store(tmp_path / f"host{i}" / "artifacts", url) for i in (1, 2))
    a, b = tmp_path / "a", tmp_path / "b"
    ga = gate(host1, a, "m1/static/fp32/p1")
    ask(a)
    assert verdict(a) == {"hit": False}
    assert host1.remote_tier.get_object(f"leases/{LOCK_PREFIX}{GK}.json") is not None
    gb = gate(host2, b, "m2/static/fp32/p1")
    ask(b)
    assert verdict(b, wait_s=1.5) is None  # another host compiles this graph: wait
    ga.close()
    assert verdict(b, wait_s=20) == {"hit": False} and gb.waited_s > 1.0
    gb.close()
