"""Corrupt bytes in real objects, partial objects, and garbage collection: nothing corrupt is served,
corrupt objects are quarantined with their reason and rebuilt, and gc never removes what is referenced."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import compile_counts, object_digests, plan_states, quick_ids, run_cli, verify, write_quick_project

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.store.local import LocalStore


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A quick project with 4 targets built once; each test copies it."""
    root = tmp_path_factory.mktemp("built")
    cfg = write_quick_project(root / "p", n=4)
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


def copy_project(cfg: Path, dest: Path) -> Path:
    shutil.copytree(cfg.parent, dest)
    return dest / cfg.name


def keys_of(cfg: Path) -> dict[str, str]:
    b = Builder(load_project(cfg))
    return {t.id: b.key(t).key for t in b.targets}


@pytest.mark.slow
def test_corrupt_bytes_are_found_quarantined_never_served_and_rebuilt(built, tmp_path):
    """Fault: four real objects are damaged on disk: a flipped byte inside model.pt (same size), a
    truncated worker.log, a manifest overwritten with garbage, and a manifest whose op count was edited
    (still valid JSON). Nothing corrupt may be served: the cheap check (sizes, manifest digest) catches
    three on lookup, only ``verify --deep`` catches the flipped byte; each is quarantined with its reason,
    and the next build compiles exactly the four again."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    before = object_digests(store.root)

    flip = store.object_dir(keys[t1]) / "model.pt"
    data = bytearray(flip.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flip.write_bytes(bytes(data))
    log = store.object_dir(keys[t2]) / "worker.log"
    log_size = log.stat().st_size
    log.write_bytes(log.read_bytes()[:10])
    (store.object_dir(keys[t3]) / "manifest.json").write_text('{"key": "garb')
    mf = store.object_dir(keys[t4]) / "manifest.json"
    raw = json.loads(mf.read_text())
    raw["metrics"]["op_count"] += 1
    mf.write_text(json.dumps(raw, indent=2))

    # nothing corrupt is served: show refuses the cheaply detectable ones (and quarantines them)
    for t in (t2, t3, t4):
        r = run_cli("show", t, "-c", str(cfg))
        assert r.returncode == 2 and "is not built for its current key" in r.stderr, (t, r.stderr)
    assert not store.object_dir(keys[t2]).exists() and not store.object_dir(keys[t3]).exists()
    assert plan_states(cfg) == {t1: "cached", t2: "missing", t3: "missing", t4: "missing"}

    # the cheap verify finds nothing more (same-size flip); the deep one finds the flipped byte
    rc, rep = verify(cfg, deep=False)
    assert rc == 0 and rep["ok"] == 1 and rep["bad"] == []
    rc, rep = verify(cfg, deep=True)
    assert rc == 1
    assert [(b["key"], b["target"]) for b in rep["bad"]] == [(keys[t1], t1)]
    assert rep["bad"][0]["reason"].startswith("model.pt sha256 is ")
    assert not store.object_dir(keys[t1]).exists()

    reasons = {}
    for d in (store.root / "quarantine").iterdir():
        reasons[d.name.split(".")[0]] = (d / "reason.txt").read_text().strip()
    assert set(reasons) == {keys[t] for t in (t1, t2, t3, t4)}
    assert reasons[keys[t2]] == f"worker.log is 10 bytes, manifest.json says {log_size}"
    assert reasons[keys[t3]].startswith("manifest.json is not valid JSON")
    assert reasons[keys[t4]] == "manifest.json does not match its own sha256 (edited or corrupt)"
    assert "(found by verify --deep)" in reasons[keys[t1]]

    # the next build compiles exactly the four, all artifacts are valid again, and identical in content
    n0 = compile_counts(cfg.parent / ".neuron-build")
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    n1 = compile_counts(cfg.parent / ".neuron-build")
    assert n1 - n0 == {t1: 1, t2: 1, t3: 1, t4: 1}
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 4
    assert set(object_digests(store.root)) == set(before)


@pytest.mark.slow
def test_partial_and_stray_objects_are_quarantined_by_lookup(built, tmp_path):
    """Fault: an object folder with files but no manifest (what a writer without staging would leave),
    an object with an extra file not in its manifest, and a stray file under objects/. A build's lookup
    quarantines the first two and rebuilds them; verify quarantines the stray file."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    keys = keys_of(cfg)
    t1, t2, t3, _ = quick_ids(4)
    (store.object_dir(keys[t1]) / "manifest.json").unlink()
    (store.object_dir(keys[t2]) / "extra.bin").write_bytes(b"x" * 10)
    stray = store.root / "objects" / "zz"
    stray.mkdir()
    (stray / "junk").write_text("junk")

    b = Builder(load_project(cfg))
    out1 = b.build(b.by_id[t1])
    out2 = b.build(b.by_id[t2])
    out3 = b.build(b.by_id[t3])
    assert (out1.status, out1.compiled, out2.status, out2.compiled) == ("PASS", True, "PASS", True)
    assert (out3.status, out3.compiled) == ("cached", False)
    reasons = sorted((d / "reason.txt").read_text().strip() for d in (store.root / "quarantine").iterdir())
    assert reasons == ["extra.bin is not listed in manifest.json", "manifest.json is missing"]

    rc, rep = verify(cfg, deep=True)
    assert rc == 1
    assert [b["key"] for b in rep["bad"]] == ["junk"]
    assert rep["bad"][0]["reason"] == "objects/zz/junk is not an object folder"
    assert not (stray / "junk").exists()
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 4


def _age(path: Path, days: float) -> None:
    t = time.time() - days * 86400
    os.utime(path, (t, t))


@pytest.mark.slow
def test_gc_keeps_referenced_removes_the_rest(built, tmp_path):
    """Fault-free upkeep with leftovers of faults: objects whose targets moved to new keys, one of them
    named by a release (and a channel), a staging folder of a dead builder, an old quarantined object
    and a lock file broken aside. gc --dry-run lists and removes nothing; gc removes exactly the
    unreferenced old objects and leftovers, reports the bytes, and never the released key."""
    cfg = copy_project(built, tmp_path / "p")
    store = LocalStore(cfg.parent / "artifacts")
    old = keys_of(cfg)
    t1, t2, t3, t4 = quick_ids(4)
    # a release of two artifacts, and a channel pointing at it
    rel = {"id": "r1", "model": "quick", "artifacts": [{"target": t1, "key": old[t1]}, {"target": t2, "key": old[t2]}]}
    (store.root / "releases" / "quick").mkdir(parents=True)
    (store.root / "releases" / "quick" / "r1.json").write_text(json.dumps(rel))
    (store.root / "channels" / "quick").mkdir(parents=True)
    (store.root / "channels" / "quick" / "prod.json").write_text(json.dumps({"release": "r1"}))
    # a new model source: every target gets a new key, the old four are no longer any target's
    src = cfg.parent / "quicklib" / "quick.py"
    src.write_text(src.read_text() + "\n# v2\n")
    r = run_cli("build", "-n", "2", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    new = keys_of(cfg)
    assert not set(new.values()) & set(old.values())
    # leftovers of faults
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    leftover = store.root / "staging" / f"{old[t3]}.{host}.{dead.pid}.abcd1234"
    (leftover / "object").mkdir(parents=True)
    (leftover / "object" / "model.pt").write_bytes(b"\0" * 5000)
    q = store.root / "quarantine" / f"{old[t4]}.deadbeef"
    q.mkdir(parents=True)
    (q / "reason.txt").write_text("test\n")
    _age(q, 30)
    aside = store.root / "locks" / f"{old[t3]}.lock.stale-123-abc"
    aside.write_text("")
    sizes = {k: sum(p.stat().st_size for p in store.object_dir(k).iterdir()) for k in old.values()}
    digests = object_digests(store.root)

    r = run_cli("gc", "--dry-run", "--keep-days", "0", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    dry = json.loads(r.stdout)
    assert object_digests(store.root) == digests and leftover.exists() and q.exists()
    removed_objects = {x["key"] for x in dry["removed"] if x["kind"] == "object"}
    assert removed_objects == {old[t3], old[t4]}  # t1 and t2 are in release r1

    r = run_cli("gc", "--keep-days", "0", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert not store.object_dir(old[t3]).exists() and not store.object_dir(old[t4]).exists()
    assert store.is_complete(old[t1]) and store.is_complete(old[t2])
    assert all(store.is_complete(k) for k in new.values())
    assert not leftover.exists() and not q.exists() and not aside.exists()
    freed = sizes[old[t3]] + sizes[old[t4]] + 5000 + 5 + 0
    assert f"freed {freed / 2**20:.1f} MiB ({freed} bytes)" in r.stdout, r.stdout
    assert "removed 2 object, 1 staging, 1 quarantine, 1 lock" in r.stdout
    rc, rep = verify(cfg, deep=True)
    assert rc == 0 and rep["ok"] == 6

    # young unreferenced objects are kept by the default window; an unreadable release stops gc
    (store.root / "releases" / "quick" / "r1.json").write_text(json.dumps({"id": "r1", "model": "quick", "artifacts": []}))
    r = run_cli("gc", "-c", str(cfg))
    assert r.returncode == 0 and "kept 4 referenced and 2 unreferenced artifacts younger than 7 days" in r.stdout
    (store.root / "releases" / "quick" / "r2.json").write_text("{not json")
    r = run_cli("gc", "--keep-days", "0", "-c", str(cfg))
    assert r.returncode == 2 and "r2.json: release file is unreadable" in r.stderr
    assert store.is_complete(old[t1]) and store.is_complete(old[t2])
