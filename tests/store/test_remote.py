"""The remote store beyond the contract suite: faults on the wire injected for real (a stopped endpoint, a
proxy answering 500 and 503 SlowDown, IAM that denies, a bucket that is not there), the compile lease
across hosts, the local cache, read-only credentials, and how a store is opened."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_build.errors import StoreDenied, StoreFailed, StoreMissing, StoreUnreachable
from neuron_build.store import LocalStore, layout, open_store
from neuron_build.store.core import ReadOnlyStore
from neuron_build.store.locks import LeaseLock
from neuron_build.store.remote import RemoteStore, cache_root
from tests.helpers.cli import REPO
from tests.helpers.s3 import FaultProxy, S3Server, aws_env, free_port
from tests.helpers.store import FILES, KEY_A, KEY_B, entry, publish

#: fast retries for fault tests: botocore's standard mode, 2 attempts in all (the default is WireSettings().retries())
FAST = {"config_kwargs": {"retries": {"total_max_attempts": 2, "mode": "standard"}, "connect_timeout": 2}}


def keys_in(client, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix`` in ``bucket``, read with boto3 behind the store's back."""
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))


# -- faults on the wire -------------------------------------------------------------------------------

def test_an_unreachable_endpoint_is_one_line_naming_the_url_and_the_fix(s3_env, monkeypatch, tmp_path):
    port = free_port()  # nothing listens here
    aws_env(monkeypatch, f"http://127.0.0.1:{port}", tmp_path)
    s = RemoteStore("s3://nb-bucket/cache", FAST, cache_dir=tmp_path / "c")
    with pytest.raises(StoreUnreachable) as read:
        s.lookup(KEY_A)
    assert read.value.writing is False and read.value.url == "s3://nb-bucket/cache"
    msg = str(read.value)
    assert "\n" not in msg
    assert msg.startswith(f"s3://nb-bucket/cache: cannot reach the endpoint http://127.0.0.1:{port} (reading "
                          f"{layout.manifest_path(KEY_A)}: EndpointConnectionError); check the network and "
                          f"AWS_ENDPOINT_URL")
    with pytest.raises(StoreUnreachable) as write:
        s.put_release("m", "r-1", {"id": "r-1"})
    assert write.value.writing is True and "(writing releases/m/r-1.json" in str(write.value)


def test_the_server_stopping_mid_upload_leaves_nothing_published(s3_bucket, s3_env, monkeypatch, tmp_path):
    # a server of this test's own (moto keeps its state in the process, so the session's server still
    # shows what reached the bucket after this one is gone)
    own = S3Server().start()
    aws_env(monkeypatch, own.url, tmp_path)
    s = RemoteStore(f"s3://{s3_bucket}/p", FAST, cache_dir=tmp_path / "c")
    real_upload = s.io._put_file
    calls = []

    def upload_then_stop(rel, src, create_only):
        calls.append(rel)
        done = real_upload(rel, src, create_only)
        if len(calls) == 1:
            own.stop()  # the endpoint goes away after the first blob
        return done

    monkeypatch.setattr(s.io, "_put_file", upload_then_stop)
    with pytest.raises(StoreUnreachable) as e:
        publish(s, KEY_A, FILES)
    assert e.value.writing is True and f"s3://{s3_bucket}/p: cannot reach the endpoint {own.url} (" in str(e.value)
    stored = keys_in(s3_env.client(), s3_bucket)
    assert stored == [f"p/{calls[0]}"]  # one blob arrived, no manifest: nothing is published
    aws_env(monkeypatch, s3_env.url, tmp_path)  # the endpoint is back: the next build publishes
    again = RemoteStore(f"s3://{s3_bucket}/p", FAST, cache_dir=tmp_path / "c")
    assert not again.lookup(KEY_A).hit
    publish(again, KEY_A, FILES)
    assert again.lookup(KEY_A, deep=True).hit


@pytest.fixture
def proxy(s3_env, monkeypatch, tmp_path):
    """A fault-injecting proxy in front of the session's server; the AWS variables point at the proxy."""
    p = FaultProxy(s3_env.url).start()
    aws_env(monkeypatch, p.url, tmp_path)
    yield p
    p.stop()


def test_a_5xx_mid_upload_leaves_no_manifest_and_the_next_publish_succeeds(s3_bucket, proxy, s3_env, tmp_path):
    s = RemoteStore(f"s3://{s3_bucket}/p", FAST, cache_dir=tmp_path / "c")
    neff = layout.blob_path(entry(FILES["model.neff"])["sha256"])
    proxy.fail("PUT", f"/{s3_bucket}/p/{neff}", times=None, code=500)
    with pytest.raises(StoreFailed) as e:
        publish(s, KEY_A, FILES)
    assert e.value.writing is True
    assert str(e.value) == (f"s3://{s3_bucket}/p: server error (500 InternalError) after 2 attempts with backoff "
                            f"(uploading {neff}); retry later (nothing half-published is left)")
    assert [st for m, path, st in proxy.seen if m == "PUT" and neff in path] == [500, 500]  # botocore retried
    assert not any(k.startswith("p/ac/") for k in keys_in(s3_env.client(), s3_bucket))
    assert s.lookup(KEY_A).damage is None and not s.lookup(KEY_A).hit
    proxy.rules.clear()
    publish(s, KEY_A, FILES)  # retried by the next build
    assert s.lookup(KEY_A, deep=True).hit


def test_throttling_is_retried_with_backoff_by_botocore(s3_bucket, proxy, tmp_path):
    three = {"config_kwargs": {"retries": {"total_max_attempts": 3, "mode": "standard"}}}
    s = RemoteStore(f"s3://{s3_bucket}/p", three, cache_dir=tmp_path / "c")
    proxy.fail("PUT", "/p/cas/", times=2, code=503)  # two SlowDowns, then the endpoint recovers
    publish(s, KEY_A, FILES)
    assert s.lookup(KEY_A, deep=True).hit
    assert [st for m, path, st in proxy.seen if m == "PUT" and "/p/cas/" in path].count(503) == 2
    proxy.fail("GET", f"/p/{layout.manifest_path(KEY_A)}", times=None, code=503)  # throttled for good
    with pytest.raises(StoreFailed) as e:
        s.lookup(KEY_A)
    assert e.value.writing is False
    assert str(e.value) == (f"s3://{s3_bucket}/p: throttled (503 SlowDown) after 3 attempts with backoff (reading "
                            f"{layout.manifest_path(KEY_A)}); retry later (nothing half-published is left)")


def test_a_missing_bucket_says_so(s3_env, tmp_path):
    s = RemoteStore("s3://nb-no-such-bucket/x", FAST, cache_dir=tmp_path / "c")
    for call in (lambda: s.lookup(KEY_A), s.keys, lambda: s.put_release("m", "r", {})):
        with pytest.raises(StoreMissing) as e:
            call()
        assert str(e.value).startswith(f"s3://nb-no-such-bucket/x: bucket 'nb-no-such-bucket' does not exist at "
                                       f"{s3_env.url} (")
        assert str(e.value).endswith("); create it (`aws s3 mb s3://nb-no-such-bucket`) or fix the store URL")


def test_missing_credentials_say_how_to_give_them(s3_env, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s = RemoteStore("s3://nb-bucket/x", FAST, cache_dir=tmp_path / "c")
    with pytest.raises(StoreDenied) as e:
        s.lookup(KEY_A)
    assert str(e.value) == (f"s3://nb-bucket/x: no credentials found (reading {layout.manifest_path(KEY_A)}); set "
                            f"AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give them in "
                            f"[build] remote_options")


@pytest.fixture
def reader_keys(s3_env, s3_bucket):
    """An IAM user of the session's server that may only read ``s3_bucket``; its access key pair."""
    import boto3
    iam = boto3.session.Session().client("iam", endpoint_url=s3_env.url, region_name="us-east-1",
                                         aws_access_key_id="testing", aws_secret_access_key="testing")
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        # moto 5.2.6 authorises a HEAD and a listing by their own action names (AWS: s3:GetObject and
        # s3:ListBucket): read-only by wildcards
        "Statement": [{"Effect": "Allow", "Action": ["s3:Get*", "s3:Head*", "s3:List*"],
                       "Resource": [f"arn:aws:s3:::{s3_bucket}", f"arn:aws:s3:::{s3_bucket}/*"]}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_credentials_that_may_only_read_serve_reads_and_deny_writes(s3_bucket, reader_keys, monkeypatch, tmp_path):
    from moto.core.authorization import enable_iam_authentication

    url = f"s3://{s3_bucket}/p"
    writer = RemoteStore(url, FAST, cache_dir=tmp_path / "w")
    publish(writer, KEY_A, FILES)
    writer.swap_channel("m", "prod", {"release": "r-1", "version": 1}, None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader_keys[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", reader_keys[1])
    with enable_iam_authentication():
        s = open_store(url, options=FAST)
        assert s.lookup(KEY_A, deep=True).hit and s.keys() == [KEY_A]
        assert (s.artifact_dir(KEY_A) / "model.pt").read_bytes() == FILES["model.pt"]
        assert s.channel("m", "prod") == {"release": "r-1", "version": 1}
        with pytest.raises(StoreDenied) as e:
            publish(s, KEY_B, {"model.pt": b"other"})
        assert e.value.writing is True
        assert str(e.value).startswith(f"{url}: access denied (AccessDenied) (uploading cas/")
        assert str(e.value).endswith("); use credentials that may write to it, or open the store read-only")
        assert not s.lookup(KEY_B).hit
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
        with pytest.raises(StoreDenied) as bad:
            RemoteStore(url, FAST, cache_dir=tmp_path / "r").lookup(KEY_A)
        assert bad.value.writing is False and "access denied (InvalidAccessKeyId)" in str(bad.value)
        assert str(bad.value).endswith("check AWS_PROFILE / AWS_ACCESS_KEY_ID and the bucket policy")


def test_a_store_opened_read_only_reads_and_only_reports_damage(tmp_path):
    url = f"memory://ro-{time.time_ns()}"
    publish(RemoteStore(url, cache_dir=tmp_path / "w"), KEY_A, FILES)
    s = RemoteStore(url, read_only=True, cache_dir=tmp_path / "r")
    assert s.lookup(KEY_A).hit
    s.io.fs.pipe_file(s.io.full(layout.manifest_path(KEY_A)), b"{torn")
    assert s.repair(KEY_A).damage.startswith("manifest is not valid JSON")
    assert s.get_object(layout.manifest_path(KEY_A)) == b"{torn"  # reported, not moved
    for write in (lambda: s.put_release("m", "r", {}), lambda: s.new_staging(KEY_B),
                  lambda: s.swap_channel("m", "c", {}, None), lambda: s.quarantine(KEY_A, "x")):
        with pytest.raises(ReadOnlyStore):
            write()


# -- the local cache ----------------------------------------------------------------------------------

def test_artifact_dir_downloads_verified_into_the_cache_and_refuses_a_tampered_blob(s3_bucket, tmp_path):
    url = f"s3://{s3_bucket}/p"
    publish(RemoteStore(url, cache_dir=tmp_path / "builder"), KEY_A, FILES)
    s = RemoteStore(url)  # the default cache: $XDG_CACHE_HOME/neuron-build/remote/<sha of url>
    view = s.artifact_dir(KEY_A)
    assert view == cache_root(url) / "views" / KEY_A[:2] / KEY_A
    assert str(view).startswith(str(tmp_path / "xdg-cache" / "neuron-build" / "remote"))
    assert {n: (view / n).read_bytes() for n in FILES} == FILES
    assert json.loads((view / "manifest.json").read_bytes()) == s.raw_manifest(KEY_A)
    assert s.artifact_dir(KEY_A) == view  # fresh: reused
    bad = bytearray(FILES["model.pt"])
    bad[0] ^= 1
    s.io.fs.pipe_file(s.io.full(layout.blob_path(entry(FILES["model.pt"])["sha256"])), bytes(bad))
    other = RemoteStore(url, cache_dir=tmp_path / "deploy")
    with pytest.raises(ValueError, match="hashes to .* \\(rot or tampering\\)"):
        other.artifact_dir(KEY_A)
    assert not other.view_dir(KEY_A).exists()


def test_logs_are_fetched_into_the_cache_for_show(tmp_path):
    s = RemoteStore(f"memory://logs-{time.time_ns()}", cache_dir=tmp_path / "c")
    publish(s, KEY_A, {"model.pt": b"m"}, logs={"worker.log": b"w\n", "compile.log": b"c\n"})
    shutil.rmtree(tmp_path / "c" / "logs", ignore_errors=True)
    p = s.log_file(KEY_A, "worker.log")
    assert p.read_bytes() == b"w\n" and (p.parent / "compile.log").read_bytes() == b"c\n"
    assert p.parent == tmp_path / "c" / "logs" / KEY_A


def test_the_memory_budget_is_host_local(tmp_path):
    s = RemoteStore(f"memory://mb-{time.time_ns()}", cache_dir=tmp_path / "c")
    with s.memory_budget(10**9).reserve(10**6, "t") as info:
        assert info["in_use_bytes"] == 0
        assert (tmp_path / "c" / "locks" / "memory.json").is_file()
    assert s.list_objects("") == []  # nothing of it went to the shared store


# -- the compile lease ----------------------------------------------------------------------------------

def test_an_expired_lease_of_another_host_is_taken_over(s3_bucket, tmp_path):
    s = RemoteStore(f"s3://{s3_bucket}/p", cache_dir=tmp_path / "c")
    dead = {"pid": 1, "host": "ci-runner-that-vanished", "token": "x", "key": KEY_A, "target": "t0",
            "since": "2026-12-01T00:00:00+00:00", "expires": time.time() - 5, "ttl_s": 60}
    s.put_object(layout.lease_path(KEY_A), json.dumps(dead).encode())
    with s.key_lock(KEY_A, target="t1") as lock:
        held = json.loads(s.get_object(layout.lease_path(KEY_A)))
        assert held["host"] != "ci-runner-that-vanished" and held["target"] == "t1" and held["expires"] > time.time()
        assert [x["host"] for x in lock.stale] == ["ci-runner-that-vanished"]
    assert s.get_object(layout.lease_path(KEY_A)) is None  # released


def test_of_builders_racing_for_an_expired_lease_one_holds_it_at_a_time(s3_bucket, tmp_path):
    import threading
    s = RemoteStore(f"s3://{s3_bucket}/p", cache_dir=tmp_path / "c")
    s.put_object(layout.lease_path(KEY_A), json.dumps({"host": "gone", "pid": 1, "expires": 0}).encode())
    inside, most, took_over = [0], [0], []
    start = threading.Barrier(4)

    def builder(i: int) -> None:
        start.wait(10)
        with LeaseLock(s, KEY_A, target=f"t{i}", poll_s=0.05) as lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.1)
            inside[0] -= 1
            took_over.extend(lock.stale)

    threads = [threading.Thread(target=builder, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1 and [x["host"] for x in took_over] == ["gone"]  # exactly one took the stale lease over
    assert s.get_object(layout.lease_path(KEY_A)) is None


def test_a_live_lease_is_renewed_and_keeps_a_rival_out(s3_bucket, tmp_path):
    s = RemoteStore(f"s3://{s3_bucket}/p", cache_dir=tmp_path / "c")
    holder = LeaseLock(s, KEY_A, target="t1", ttl_s=0.8).acquire()
    try:
        first = json.loads(s.get_object(layout.lease_path(KEY_A)))["expires"]
        time.sleep(1.2)  # longer than the ttl: only renewals keep it alive
        now = json.loads(s.get_object(layout.lease_path(KEY_A)))
        assert now["expires"] > first and now["expires"] > time.time() and now["target"] == "t1"
        rival = LeaseLock(s, KEY_A, target="t2", ttl_s=0.8, poll_s=0.05)
        took = []
        import threading
        t = threading.Thread(target=lambda: took.append(rival.acquire()))
        t.start()
        time.sleep(0.5)
        assert took == []  # still waiting
    finally:
        holder.release()
    t.join(10)
    assert took and rival.waited_for["target"] == "t1" and rival.stale == []
    rival.release()
    assert s.get_object(layout.lease_path(KEY_A)) is None


# -- opening a store ----------------------------------------------------------------------------------

def test_open_store_picks_the_implementation_from_the_location(tmp_path):
    assert isinstance(open_store(str(tmp_path / "folder")), LocalStore)
    assert isinstance(open_store(tmp_path / "folder"), LocalStore)
    mem = open_store("memory://open-store-test", options={})
    assert isinstance(mem, RemoteStore) and mem.location == "memory://open-store-test"
    f = open_store(f"file://{tmp_path}/shared")
    publish(f, KEY_A, FILES)
    assert (tmp_path / "shared" / layout.manifest_path(KEY_A)).is_file() and f.lookup(KEY_A, deep=True).hit


def test_s3fs_and_boto3_load_only_for_an_s3_store():
    code = ("import sys, neuron_build, neuron_build.store as s; s.open_store('memory://x').keys(); "
            "print(sorted(m for m in ('s3fs', 'boto3', 'botocore', 'aiobotocore') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "[]"


def test_a_url_fsspec_does_not_know_is_a_clear_error(tmp_path):
    from neuron_build.errors import UserError
    with pytest.raises(UserError, match=r"^nosuchproto://x: not a store URL fsspec can open"):
        RemoteStore("nosuchproto://x", cache_dir=tmp_path)


def test_the_cache_folder_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root("s3://b/p").parent == tmp_path / "x" / "neuron-build" / "remote"
    assert cache_root("s3://b/p") != cache_root("s3://b/q")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root("s3://b/p").parent == Path.home() / ".cache" / "neuron-build" / "remote"


def test_the_remote_store_implements_every_protocol(tmp_path):
    from neuron_build.store import ArtifactStore
    from neuron_build.store.contract import ActionCache, Coordination, ObjectIO, RecordStore, ReleaseStore
    s = RemoteStore("memory://protocols", cache_dir=tmp_path)
    assert all(isinstance(s, p) for p in (ActionCache, RecordStore, ReleaseStore, Coordination, ObjectIO,
                                          ArtifactStore))
