"""Build hosts that share one S3 remote, each with its own checkout and local store (other hosts: other
paths, other state folders), started at the same time on an overlapping matrix: the remote's compile
lease makes each key compile once, on one host, and the other hosts download that artifact; a dead
host's lease expires and another builder takes over."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from pathlib import Path

from tests.helpers.cli import events, run_cli
from tests.helpers.faultkit import compile_counts, kill_group, quick_ids, start_build, write_quick_project

N = 4  # keys in the matrix; both hosts build all of them (today: 8 compiles, two blobs per key)


def host(root: Path, bucket: str, n: int = N, seconds: float = 1.0) -> Path:
    """A checkout of the quick project whose compiles take ``seconds`` longer (so the hosts overlap),
    with ``[build] remote`` on ``bucket``."""
    return write_quick_project(root, n=n, factory="quicklib.quick:slow", kwargs=f"{{ seconds = {seconds}, width = 8 }}",
                               build_extra=f'remote = "s3://{bucket}/team"')


def keys_of(cfg: Path) -> dict[str, str]:
    r = run_cli("plan", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    return {t["target"]: t["key"] for t in json.loads(r.stdout)["targets"]}


def local_blobs(cfg: Path, key: str) -> dict[str, str]:
    """{file: sha256} of ``key``'s manifest in the checkout's local store."""
    man = json.loads((cfg.parent / "artifacts" / "ac" / key[:2] / f"{key}.json").read_text())
    return {name: ent["sha256"] for name, ent in man["files"].items()}


def test_two_hosts_on_one_remote_compile_each_key_once(tmp_path, s3_env, s3_bucket):
    a, b = host(tmp_path / "host-a" / "proj", s3_bucket), host(tmp_path / "host-b" / "checkout", s3_bucket)
    keys = keys_of(a)
    assert keys_of(b) == keys and len(set(keys.values())) == N  # other paths, the same keys
    procs = [start_build(cfg, tmp_path / f"{name}.out", "-n", "2") for name, cfg in (("a", a), ("b", b))]
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            kill_group(p)
    outs = [(tmp_path / f"{name}.out").read_text() for name in "ab"]
    assert [p.returncode for p in procs] == [0, 0], outs
    per_host = [compile_counts(cfg.parent / ".neuron-build") for cfg in (a, b)]
    total = per_host[0] + per_host[1]
    print(f"compiles: host a {dict(per_host[0])}, host b {dict(per_host[1])}")
    assert total == Counter({t: 1 for t in quick_ids(N)}), (per_host, outs)  # each key once, on one host
    assert sum(total.values()) == N

    client = s3_env.client()
    remote = {}
    keys = keys_of(a)  # published under the keys the builds completed with what the factory read
    assert keys_of(b) == keys
    for tid, key in keys.items():
        man = json.loads(client.get_object(Bucket=s3_bucket, Key=f"team/ac/{key[:2]}/{key}.json")["Body"].read())
        remote[tid] = {name: ent["sha256"] for name, ent in man["files"].items()}
        assert local_blobs(a, key) == local_blobs(b, key) == remote[tid], tid  # one blob per key, everywhere
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="team/cas/")
    stored = sorted(o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", []))
    assert stored == sorted({sha for files in remote.values() for sha in files.values()})  # no second copy
    assert client.list_objects_v2(Bucket=s3_bucket, Prefix="team/leases/").get("KeyCount", 0) == 0  # released
    waited = [ev for cfg in (a, b) for ev in events(cfg.parent / ".neuron-build", "reused")]
    assert len(waited) + sum(1 for cfg in (a, b) for _ in events(cfg.parent / ".neuron-build", "downloaded")) == N


def test_a_dead_hosts_lease_expires_and_another_builder_takes_over(tmp_path, s3_env, s3_bucket):
    cfg = host(tmp_path / "a", s3_bucket, n=1, seconds=0)
    tid, key = next(iter(keys_of(cfg).items()))
    ttl = 15.0  # longer than the build takes to reach the lock on a loaded machine
    # the lease a build host left when it died (another host: its pid cannot be checked from here)
    lease = {"pid": 4242, "host": "build-host-that-died", "proc_start": 1.0, "since": "2026-12-01T00:00:00Z",
             "token": "0123456789abcdef", "key": key, "target": tid, "expires": time.time() + ttl, "ttl_s": 60.0}
    client = s3_env.client()
    client.put_object(Bucket=s3_bucket, Key=f"team/leases/{key}.json", Body=json.dumps(lease).encode())
    t0 = time.monotonic()
    r = run_cli("build", "-c", str(cfg), timeout=240)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    state = cfg.parent / ".neuron-build"
    wait = events(state, "waiting for lock")
    assert wait and wait[0]["held_by_host"] == "build-host-that-died" and wait[0]["held_by_pid"] == 4242
    took_over = events(state, "took over a stale compile lease")
    assert len(took_over) == 1 and took_over[0]["why"] == "expired", took_over
    assert compile_counts(state) == {tid: 1}
    started = dt.datetime.fromisoformat(events(state, "compiling")[0]["timestamp"].replace("Z", "+00:00"))
    assert started.timestamp() >= lease["expires"]  # it waited for the expiry, not less
    assert took < ttl + 60
    assert client.list_objects_v2(Bucket=s3_bucket, Prefix="team/leases/").get("KeyCount", 0) == 0
    done = keys_of(cfg)[tid]  # the key the build completed with what the factory read (the lease was the plan's)
    assert client.head_object(Bucket=s3_bucket, Key=f"team/ac/{done[:2]}/{done}.json")["ContentLength"] > 0


def test_the_lease_fails_open_when_the_remote_cannot_be_reached(tmp_path, s3_env, monkeypatch):
    from neuron_build.store import LocalStore
    from neuron_build.store.remote import RemoteStore, clear_client_cache
    from neuron_build.store.tiered import ReadThroughStore
    from tests.helpers.s3 import aws_env, free_port

    aws_env(monkeypatch, f"http://127.0.0.1:{free_port()}", tmp_path)  # nothing listens there
    clear_client_cache()
    warned: list[str] = []
    remote = RemoteStore("s3://nb-bucket/team", {"connect_timeout_s": 1, "read_timeout_s": 1, "attempts": 2},
                         cache_dir=tmp_path / "cache")
    store = ReadThroughStore(LocalStore(tmp_path / "local"), remote, warn=warned.append)
    key = "ab" * 32
    with store.key_lock(key, target="t") as lock:  # the compile goes on under this host's lock
        assert lock.lease is None and lock.local.owner()["target"] == "t"
    assert store.unreachable is not None and "cannot reach the endpoint" in store.unreachable
    assert len(warned) == 1 and warned[0].startswith("remote store s3://nb-bucket/team cannot be reached (")
    t0 = time.monotonic()
    with store.key_lock(key, target="t") as lock:  # given up for the rest of the process: no second wait
        assert lock.lease is None
    assert time.monotonic() - t0 < 0.5 and len(warned) == 1
