"""Faults on the wire to a shared S3 store, made by a TCP proxy on loopback between the clients (s3fs,
boto3) and the moto S3 server (:mod:`proxy`): a black hole mid-upload ends the build within the bound the
wire settings give and leaves the artifact pending for the next build; resets and delays are retried."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from neuron_build.store.wire import WireSettings
from tests.helpers.cli import REPO, run_cli
from tests.helpers.faultkit import compile_counts, quick_ids, write_quick_project
from tests.helpers.proxy import TcpFaultProxy

#: Short wire settings for tests (seconds): a call ends within 2 x (1 + 2) + 1 = 7 s on a dark network.
FAST = WireSettings(connect_timeout_s=1, read_timeout_s=2, attempts=2)
OPTIONS = "remote_options = { connect_timeout_s = 1, read_timeout_s = 2, attempts = 2 }"


@pytest.fixture
def proxy(s3_env):
    p = TcpFaultProxy(s3_env.url).start()
    yield p
    p.stop()


def remote_project(root: Path, bucket: str, n: int = 1, extra_mb: int = 0) -> Path:
    """The quick project with ``[build] remote`` on ``bucket`` and the short wire settings; an artifact
    about ``extra_mb`` MiB large."""
    return write_quick_project(root, n=n, build_extra=f'remote = "s3://{bucket}/team"\n{OPTIONS}',
                               kwargs=f"{{ width = 8, extra_mb = {extra_mb} }}")


def pending_pushes(cfg: Path) -> list[str]:
    """Keys of the pending-push markers in the project's local store."""
    folder = cfg.parent / "artifacts" / "pending-push"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def remote_keys(client, bucket: str, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_the_documented_bound_follows_from_the_settings():
    assert WireSettings().call_bound_s() == 4 * (5 + 30) + (1 + 2 + 4)  # attempts x (connect + read) + backoff
    assert WireSettings().push_bound_s() == 294
    assert FAST.call_bound_s() == 7 and FAST.push_bound_s() == 14
    page = " ".join((REPO / "docs" / "store.md").read_text().split())  # the docs page states the defaults' bound
    assert f"= **{WireSettings().call_bound_s():g} s**" in page and f"**{WireSettings().push_bound_s():g} s**" in page
    got, rest = WireSettings.from_options({"connect_timeout_s": 1, "read_timeout_s": 2, "attempts": 2,
                                          "profile": "ci"})
    assert got == FAST and rest == {"profile": "ci"}  # fsspec never sees ours
    got, _ = WireSettings.from_options({"config_kwargs": {"read_timeout": 9, "retries": {"max_attempts": 2}}})
    assert (got.read_timeout_s, got.attempts) == (9, 3)  # botocore's own spelling wins, as its user expects


def test_every_bad_remote_option_is_reported_at_once_naming_the_file_and_key(tmp_path, s3_env, s3_bucket):
    """Each bad option was one error per run, naming neither the file nor its table's path, and the transfer
    settings had no upper bound (a 6 GiB part, 1000 ranges at once were taken): now one config error with a
    line per fault, S3's limits as the bounds."""
    cfg = write_quick_project(tmp_path / "a", n=1, build_extra=(
        f'remote = "s3://{s3_bucket}/team"\n'
        "remote_options = { read_timeout_s = -1, multipart_chunksize = 6442450944, max_concurrency = 1000, "
        "multipart_threshold = 6442450944, multipart_copy_threshold = 1024, endpoint = \"http://x\" }"))
    r = run_cli("plan", "-c", str(cfg))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0] == f"error: {cfg}: invalid configuration (6 faults)"
    assert lines[1].startswith(f"build.remote_options: unknown key 'endpoint' for s3://{s3_bucket}/team (did you "
                               "mean 'endpoint_url'?); the keys are connect_timeout_s, ")
    assert lines[2:] == [
        "build.remote_options: read_timeout_s = -1 is not a positive number of seconds; give e.g. read_timeout_s = 30.0",
        "build.remote_options: multipart_threshold = 6442450944 is not a whole number from 1 to 5368709120 (5 GiB), "
        "the largest single PutObject; give e.g. multipart_threshold = 8388608",
        "build.remote_options: multipart_chunksize = 6442450944 is not a whole number from 5242880 (5 MiB) to "
        "5368709120 (5 GiB), S3's part sizes; give e.g. multipart_chunksize = 8388608",
        "build.remote_options: max_concurrency = 1000 is not a whole number from 1 to 32, the range-read threads of "
        "a download; give e.g. max_concurrency = 10",
        "build.remote_options: multipart_copy_threshold = 1024 is not a whole number from 5242880 (5 MiB) to "
        "5368709120 (5 GiB), S3's CopyObject limit; give e.g. multipart_copy_threshold = 5368709120"]
    assert "Traceback" not in r.stderr


def test_a_store_opened_with_bad_options_reports_them_all_in_one_line():
    """A store opened with options the config did not check (a Dask worker's store spec)."""
    from neuron_build.errors import UserError
    from neuron_build.store.remote import RemoteStore

    with pytest.raises(UserError) as e:
        RemoteStore("memory://wire-opts", {"attempts": 0, "max_concurrency": 33, "atempts": 2})
    assert str(e.value).startswith("[build] remote_options: unknown key 'atempts' for memory://wire-opts (did you "
                                   "mean 'attempts'?); the keys are ")
    assert str(e.value).endswith("; attempts = 0 is not a whole number >= 1; give e.g. attempts = 4; "
                                 "max_concurrency = 33 is not a whole number from 1 to 32, the range-read threads "
                                 "of a download; give e.g. max_concurrency = 10")
    with pytest.raises(UserError, match=r"^\[build\] remote_options: config_kwargs.retries.max_attempts = -1 is not a "
                                        r"whole number >= 0; give e.g. config_kwargs.retries.max_attempts = 3; "
                                        r"config_kwargs.read_timeout = 0 is not a positive number of seconds; give e.g. "
                                        r"config_kwargs.read_timeout = 30.0$"):
        WireSettings.from_options({"config_kwargs": {"read_timeout": 0, "retries": {"max_attempts": -1}}})
    from neuron_build.remote_options import option_faults  # the config's check sees botocore's spelling too

    assert option_faults("s3://b/p", {"config_kwargs": {"connect_timeout": "5"}}) == [
        "config_kwargs.connect_timeout = '5' is not a positive number of seconds; give e.g. "
        "config_kwargs.connect_timeout = 5.0"]


def test_remote_options_without_a_remote_are_refused(tmp_path):
    cfg = write_quick_project(tmp_path / "a", n=1, build_extra="remote_options = { profile = \"ci\" }")
    r = run_cli("plan", "-c", str(cfg))
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("build.remote_options: profile given, but [build] remote is not set, so no store reads them; set remote = "
            "\"s3://<bucket>/<prefix>\" or remove remote_options") in r.stderr


def test_a_black_hole_mid_upload_ends_the_build_within_the_bound_and_the_next_build_pushes(
        tmp_path, s3_env, s3_bucket, proxy):
    # an artifact of ~10 MiB: more than the socket buffers take, so the upload stalls mid-way
    cfg = remote_project(tmp_path / "a", s3_bucket, extra_mb=10)
    env = {"AWS_ENDPOINT_URL": proxy.url}
    proxy.black_hole(f"PUT /{s3_bucket}/team/cas/".encode(), after_bytes=1 << 20)
    r = run_cli("build", "-c", str(cfg), env=env, timeout=120)  # today's main: still waiting after 120 s
    ended = time.monotonic()
    assert proxy.holed, "the upload never reached the black hole"
    after_hole = ended - proxy.holed_at
    print(f"black hole opened, build ended {after_hole:.1f} s later (bound {FAST.push_bound_s():g} s)")
    assert after_hole <= FAST.push_bound_s() + 3, r.stdout + r.stderr  # + process exit and the summary
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout
    assert f"NOT PUSHED 1 artifact to s3://{s3_bucket}/team" in r.stdout
    assert "cannot reach the endpoint" in r.stdout and "ReadTimeoutError" in r.stdout
    print(r.stdout)
    pending = pending_pushes(cfg)
    assert len(pending) == 1
    key = pending[0]
    assert f"not pushed: {quick_ids(1)[0]} (key {key[:16]})" in r.stdout  # which artifact
    client = s3_env.client()
    assert remote_keys(client, s3_bucket, "team/ac/") == []  # nothing half-published: no manifest

    proxy.heal()
    r = run_cli("build", "-c", str(cfg), env=env, timeout=120)  # the next build, not an explicit push
    assert r.returncode == 0, r.stdout + r.stderr
    assert compile_counts(cfg.parent / ".neuron-build") == {quick_ids(1)[0]: 1}  # pushed, not rebuilt
    assert remote_keys(client, s3_bucket, "team/ac/") == [f"team/ac/{key[:2]}/{key}.json"]
    assert pending_pushes(cfg) == []
    man = json.loads(client.get_object(Bucket=s3_bucket, Key=f"team/ac/{key[:2]}/{key}.json")["Body"].read())
    for ent in man["files"].values():  # every blob whole on the remote
        body = client.get_object(Bucket=s3_bucket, Key=f"team/cas/{ent['sha256'][:2]}/{ent['sha256']}")["Body"]
        assert hashlib.sha256(body.read()).hexdigest() == ent["sha256"]


#: 5 MiB parts (S3's least), 3 at once: a multipart transfer of a small blob
PARTS = {"multipart_threshold": 5 << 20, "multipart_chunksize": 5 << 20, "max_concurrency": 3}


def _store(bucket: str, tmp_path: Path, **more):
    from neuron_build.store.remote import RemoteStore, clear_client_cache

    clear_client_cache()  # AWS_ENDPOINT_URL changed: clients for the proxy
    return RemoteStore(f"s3://{bucket}/team", {"connect_timeout_s": 1, "read_timeout_s": 2, "attempts": 3, **more},
                       cache_dir=tmp_path / "cache")


def _blob(tmp_path: Path, mib: float) -> tuple[str, Path]:
    data = os.urandom(int(mib * 2**20))
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def test_a_reset_mid_upload_is_retried(tmp_path, s3_env, s3_bucket, proxy, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = _store(s3_bucket, tmp_path)
    sha, path = _blob(tmp_path, 3)
    proxy.reset(f"PUT /{s3_bucket}/team/cas/".encode(), after_bytes=1 << 20)  # s3fs: the blob upload
    assert store.put_blob(sha, path) is True
    assert proxy.resets == 1
    assert store.blob_damage(sha, path.stat().st_size, deep=True) is None
    proxy.reset(f"PUT /{s3_bucket}/team/releases/".encode(), after_bytes=10)  # boto3: a small object
    assert store.put_release("m", "r-1", {"id": "r-1"}) is True
    assert proxy.resets == 2
    assert store.release("m", "r-1") == {"id": "r-1"}


def test_delays_within_the_timeouts_pass_and_a_stall_longer_than_them_is_retried(tmp_path, s3_env, s3_bucket, proxy,
                                                                               monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = _store(s3_bucket, tmp_path)
    sha, path = _blob(tmp_path, 1)
    proxy.delay(0.01)  # 10 ms per 16 KiB chunk: a slow link, every call slower but none timed out
    t0 = time.monotonic()
    assert store.put_blob(sha, path) is True
    assert store.put_release("m", "r-1", {"id": "r-1"}) is True and store.release("m", "r-1") == {"id": "r-1"}
    assert time.monotonic() - t0 > 0.5  # the delay was there
    proxy.heal()
    before = proxy.connections
    proxy.delay(3.0, times=1)  # one chunk held 3 s (> read_timeout_s = 2): the first attempt times out
    t0 = time.monotonic()
    assert store.release("m", "r-1") == {"id": "r-1"}  # (a read: the late first attempt changes nothing)
    assert time.monotonic() - t0 >= 2  # it waited out the read timeout, then the retry answered
    assert proxy.connections > before  # on a new connection


def test_a_black_hole_in_a_multipart_upload_ends_within_the_push_bound(tmp_path, s3_env, s3_bucket, proxy,
                                                                       monkeypatch):
    from neuron_build.errors import StoreUnreachable

    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = _store(s3_bucket, tmp_path, **PARTS)
    sha, path = _blob(tmp_path, 11)
    # three 5 MiB parts in flight at once: they go dark after 1 MiB, then the abort of the upload meets the
    # same black hole
    proxy.black_hole(b"partNumber=", after_bytes=1 << 20)
    with pytest.raises(StoreUnreachable) as e:
        store.put_blob(sha, path)
    after_hole = time.monotonic() - proxy.holed_at
    settings = store.wire
    print(f"multipart: ended {after_hole:.1f} s after the black hole (bound {settings.push_bound_s():g} s)")
    assert after_hole <= settings.push_bound_s() + 1
    assert "ReadTimeoutError" in str(e.value) or "cannot reach the endpoint" in str(e.value)
    proxy.heal()
    assert store.blob_size(sha) is None  # nothing half-published
    proxy.reset(b"partNumber=2", after_bytes=1 << 20)  # a reset mid-part is retried
    assert store.put_blob(sha, path) is True
    assert proxy.resets == 1
    assert store.blob_damage(sha, path.stat().st_size, deep=True) is None
    # a slow link (every chunk delayed, none past the timeouts), then a stall past the read timeout: retried
    for delay, times in ((0.0005, None), (3.0, 1)):
        sha, path = _blob(tmp_path, 11)
        proxy.delay(delay, times=times)
        t0 = time.monotonic()
        assert store.put_blob(sha, path) is True
        assert time.monotonic() - t0 > (2 if times else 0.2)  # the delay was there
        proxy.heal()
        assert store.blob_damage(sha, path.stat().st_size, deep=True) is None


def test_ranged_downloads_retry_a_reset_pass_delays_and_end_within_the_bound_in_a_black_hole(
        tmp_path, s3_env, s3_bucket, proxy, monkeypatch):
    from neuron_build.errors import StoreUnreachable

    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = _store(s3_bucket, tmp_path, **PARTS)
    sha, path = _blob(tmp_path, 11)
    s3_env.client().put_object(Bucket=s3_bucket, Key=f"team/cas/{sha[:2]}/{sha}", Body=path.read_bytes())
    proxy.reset(b"GET /", after_bytes=0, times=1)  # the first range's connection reset
    store.get_blob(sha, tmp_path / "a")
    assert proxy.resets == 1 and (tmp_path / "a").read_bytes() == path.read_bytes()
    proxy.reset(b"bytes=5242880-", after_bytes=0, times=1)  # a later range's (read in a thread, boto3)
    store.get_blob(sha, tmp_path / "a2")
    assert proxy.resets == 2 and (tmp_path / "a2").read_bytes() == path.read_bytes()
    proxy.delay(0.0005)  # a slow link: three ranges, none timed out
    store.get_blob(sha, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == path.read_bytes()
    proxy.heal()
    proxy.black_hole(b"GET /", after_bytes=0)
    with pytest.raises(StoreUnreachable):
        store.get_blob(sha, tmp_path / "c")
    after_hole = time.monotonic() - proxy.holed_at
    assert after_hole <= store.wire.call_bound_s() + store.wire.read_timeout_s + 1
    assert not (tmp_path / "c").exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_history_entry_whose_answer_was_lost_is_recorded_once(tmp_path, s3_env, s3_bucket, proxy, monkeypatch):
    """The create-only PUT of a promotion's history entry reaches the server, its answer is lost, the client
    retries: the retry finds the object there (412). Before, that counted as a name collision and the entry
    was written again under another name: one promotion, two entries."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = _store(s3_bucket, tmp_path)
    entry = {"time": "2026-12-02T06:00:00+00:00", "action": "promote", "model": "m", "channel": "prod",
             "from": None, "to": "r-1", "version": 1, "op": "0123456789abcdef"}
    proxy.lose_answer(f"PUT /{s3_bucket}/team/channels/m/prod.history/".encode())
    store.append_history("m", "prod", entry)
    assert proxy.lost_answers == 1
    assert store.history("m", "prod") == [entry]
    assert len(remote_keys(s3_env.client(), s3_bucket, "team/channels/m/prod.history/")) == 1
    store.append_history("m", "prod", entry)  # the whole write retried by its caller: still once
    assert len(remote_keys(s3_env.client(), s3_bucket, "team/channels/m/prod.history/")) == 1
    # entries without an op (refusals) are each their own; a store that already holds an op twice reads once
    store.append_history("m", "prod", {**entry, "op": None, "action": "refuse"})
    s3_env.client().put_object(Bucket=s3_bucket, Key="team/channels/m/prod.history/20261202T070000.000000Z-dup.json",
                             Body=json.dumps(entry).encode())
    assert [e["action"] for e in store.history("m", "prod")] == ["promote", "refuse"]
