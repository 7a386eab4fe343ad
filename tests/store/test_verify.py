"""``verify`` parses every record a store holds beside its manifests and blobs, and reports one that does
not parse as its kind (issue 29 item 9: a ``targets/.../last.json`` that is not JSON was reported all good)."""

from __future__ import annotations

import json

from neuron_build.store.local import LocalStore
from neuron_build.store.verify import verify_store

KEY = "ab" * 32

GOOD = {
    "targets/tiny/b1/fp32/p1/last.json": {"target": "tiny/b1/fp32/p1", "key": KEY, "status": "PASS"},
    "targets/tiny/b1/fp32/p1/failure.json": {"target": "tiny/b1/fp32/p1", "key": KEY, "status": "ERROR"},
    "targets/tiny/imports.json": {"model": "tiny", "files": ["tinylib/act.py"]},
    f"results/{KEY}/validation/cpu.json": {"verdict": "pass", "outputs": []},
    f"results/{KEY}/bench/cpu.json": {"median_ms": 1.0},
    "channels/tiny/prod.history/20261202T060000.000000Z-0123456789abcdef.json": {"action": "promote", "to": "r-1"},
    "ledger/2026-12-02/050000.000000Z-host-0001.json": {"schema": 1, "records": [  # a no-op build's batch
        {"target": "tiny/b1/fp32/p1", "key": KEY, "event": "hit", "status": "cached", "time": "2026-12-02T05:00:00Z"}]},
}


def _store(tmp_path, objects: dict) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    for rel, obj in objects.items():
        store.put_object(rel, obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    return store


def test_good_records_verify_clean(tmp_path):
    rep = verify_store(_store(tmp_path, GOOD))
    assert rep.clean, rep.to_json()
    assert rep.records_checked == len(GOOD)


def test_every_record_kind_that_does_not_parse_is_reported_with_its_path_and_fix(tmp_path):
    bad = {
        "targets/tiny/b4/fp32/p1/last.json": b"{ not json",
        "targets/tiny/b4/fp32/p2/last.json": {"target": "tiny/b4/fp32/p2"},  # JSON, but no key
        "targets/tiny/b4/fp32/p2/failure.json": [1, 2],
        f"results/{KEY}/validation/neuron.json": {"verdict": "maybe"},
        "channels/tiny/prod.history/20261202T070000.000000Z-00000000deadbeef.json": b"\x00\x01",
        "ledger/2026-12-02/060000.000000Z-host-abcd.json": b"[",
        f"graphs/{KEY[:2]}/{KEY}.json": b"",
        "store-id.json": b"nope",
    }
    rep = verify_store(_store(tmp_path, {**GOOD, **bad}))
    assert not rep.clean
    assert rep.records_checked == len(GOOD) + len(bad)
    got = {b.key: (b.kind, b.reason) for b in rep.bad}
    assert got == {
        "targets/tiny/b4/fp32/p1/last.json": ("record", "target record: not JSON"),
        "targets/tiny/b4/fp32/p2/last.json": ("record", "target record: JSON, but not a target record"),
        "targets/tiny/b4/fp32/p2/failure.json": ("record", "failure record: JSON, but not a failure record"),
        f"results/{KEY}/validation/neuron.json": ("record", "validation result: JSON, but not a validation result"),
        "channels/tiny/prod.history/20261202T070000.000000Z-00000000deadbeef.json": ("record",
                                                                                    "history entry: not JSON"),
        "ledger/2026-12-02/060000.000000Z-host-abcd.json": ("record", "ledger record: not JSON"),
        f"graphs/{KEY[:2]}/{KEY}.json": ("record", "graph index entry: not JSON"),
        "store-id.json": ("record", "store identity: not JSON"),
    }
    first = next(b for b in rep.bad if b.key == "targets/tiny/b4/fp32/p1/last.json")
    assert first.target == "tiny/b4/fp32/p1"
    assert first.fix == ("`neuron-build build tiny/b4/fp32/p1` writes it again (a cached target too); "
                         "or remove targets/tiny/b4/fp32/p1/last.json")
    assert (tmp_path / "store" / "targets/tiny/b4/fp32/p1/last.json").read_bytes() == b"{ not json"  # reported only
