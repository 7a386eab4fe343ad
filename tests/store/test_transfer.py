"""Large objects on S3 (issue 39): each blob uploaded once however many artifacts name it, create-only races
that both succeed, error lines naming the upload, multipart uploads and ranged downloads in parts, verified as
they stream; on moto behind the counting proxy."""

from __future__ import annotations

import hashlib
import json
import os
import threading

import pytest

from neuron_build.store import LocalStore, layout
from neuron_build.store.remote import RemoteStore
from neuron_build.store.tiered import ReadThroughStore
from tests.helpers.s3 import FaultProxy, aws_env
from tests.helpers.store import KEY_A, KEY_B, publish

MIB = 1 << 20
#: small parts so that a multipart transfer stays cheap (S3's least part is 5 MiB)
SMALL = {"multipart_threshold": 5 * MIB, "multipart_chunksize": 5 * MIB, "max_concurrency": 3,
         "config_kwargs": {"retries": {"total_max_attempts": 2, "mode": "standard"}}}


@pytest.fixture
def proxy(s3_env, monkeypatch, tmp_path):
    """The counting, fault-injecting proxy in front of the session's server; the AWS variables point at it."""
    p = FaultProxy(s3_env.url).start()
    aws_env(monkeypatch, p.url, tmp_path)
    yield p
    p.stop()


def _uploads(proxy: FaultProxy, rel: str) -> int:
    """Uploads begun of the object ``rel``: a whole PUT, or a multipart upload created."""
    return sum(1 for m, path, _ in proxy.seen if rel in path and (
        (m == "PUT" and "partNumber=" not in path) or (m == "POST" and path.endswith("?uploads"))))


def _tiered(bucket: str, tmp_path, options=None, name: str = "h") -> ReadThroughStore:
    remote = RemoteStore(f"s3://{bucket}/p", options, cache_dir=tmp_path / f"{name}-cache")
    return ReadThroughStore(LocalStore(tmp_path / f"{name}-local"), remote, warn=lambda m: None)


def test_two_artifacts_sharing_a_blob_published_at_once_upload_it_once(s3_bucket, proxy, tmp_path):
    shared = os.urandom(9 * MIB)  # over the 8 MiB default threshold: a multipart upload
    blob = layout.blob_path(hashlib.sha256(shared).hexdigest())
    s = _tiered(s3_bucket, tmp_path)
    go = threading.Barrier(2)
    errors: list[BaseException] = []

    def one(key: str, extra: bytes) -> None:
        try:
            go.wait()
            publish(s, key, {"model.pt": shared, "own.txt": extra})
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(k, k.encode())) for k in (KEY_A, KEY_B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and s.push_failures == []
    assert _uploads(proxy, blob) == 1
    assert s.remote.lookup(KEY_A, deep=True).hit and s.remote.lookup(KEY_B, deep=True).hit


def test_a_sequential_push_of_artifacts_sharing_a_blob_offers_it_once(s3_bucket, proxy, tmp_path):
    shared = os.urandom(MIB)
    blob = layout.blob_path(hashlib.sha256(shared).hexdigest())
    s = _tiered(s3_bucket, tmp_path)
    publish(s, KEY_A, {"model.pt": shared})
    publish(s, KEY_B, {"model.pt": shared, "b.txt": b"b"})
    assert s.push_failures == []
    assert _uploads(proxy, blob) == 1
    assert s.remote.lookup(KEY_B, deep=True).hit


def test_two_processes_of_one_host_upload_a_large_blob_once(s3_bucket, proxy, tmp_path, monkeypatch):
    from neuron_build.store import transfer

    monkeypatch.setattr(transfer, "key_lock", lambda name: threading.Lock())  # two processes: no shared thread lock
    data = os.urandom(12 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    src = tmp_path / "blob"
    src.write_bytes(data)
    stores = [RemoteStore(f"s3://{s3_bucket}/p", SMALL, cache_dir=tmp_path / "host-cache") for _ in range(2)]
    go, out = threading.Barrier(2), {}

    def one(i: int) -> None:
        go.wait()
        out[i] = stores[i].put_blob(sha, src)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out.values()) == [False, True]  # the second waited, then found it there
    rel = layout.blob_path(sha)
    assert [m for m, p, _ in proxy.seen if rel in p and p.endswith("?uploads")] == ["POST"]  # one upload
    assert [m for m, p, _ in proxy.seen if rel in p and m == "GET"] == []  # not read back (nor copied: fresh)
    assert [p for m, p, _ in proxy.seen if rel in p and m == "PUT" and "partNumber=" not in p] == []


def test_two_hosts_racing_on_one_blob_both_succeed(s3_bucket, proxy, tmp_path, monkeypatch):
    from neuron_build.store import transfer

    monkeypatch.setattr(transfer, "key_lock", lambda name: threading.Lock())  # two hosts: no shared lock
    data = os.urandom(12 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    src = tmp_path / "blob"
    src.write_bytes(data)
    stores = [RemoteStore(f"s3://{s3_bucket}/p", SMALL, cache_dir=tmp_path / f"c{i}") for i in range(2)]
    go, out = threading.Barrier(2), {}

    def one(i: int) -> None:
        go.wait()
        try:
            out[i] = stores[i].put_blob(sha, src)
        except Exception as e:  # reported by the assertion below
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(v, bool) for v in out.values()), out
    assert True in out.values()
    assert stores[1].blob_damage(sha, len(data), deep=True) is None


def test_a_competing_completion_means_the_blob_is_there(s3_bucket, s3_env, proxy, tmp_path):
    data = os.urandom(11 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    src = tmp_path / "blob"
    src.write_bytes(data)
    rel = layout.blob_path(sha)
    s = RemoteStore(f"s3://{s3_bucket}/p", SMALL, cache_dir=tmp_path / "c")

    def rival_completes() -> bool:  # another host's upload lands first; ours then finds its upload gone
        s3_env.client().put_object(Bucket=s3_bucket, Key=f"p/{rel}", Body=data)
        return True

    proxy.fail("POST", f"/p/{rel}\\?uploadId=", times=1, code=404, when=rival_completes)
    assert s.put_blob(sha, src) is False  # kept the rival's copy; no error
    assert [st for m, path, st in proxy.seen if m == "POST" and "uploadId=" in path] == [404]
    # resolved by a HEAD (its size): the rival's blob is neither downloaded again nor copied onto itself
    assert [(m, path) for m, path, _ in proxy.seen if rel in path and (
        m == "GET" or (m == "PUT" and "uploadId=" not in path))] == [], proxy.seen
    assert s.blob_damage(sha, len(data), deep=True) is None


def test_a_failed_upload_names_the_blob_and_the_destination_never_a_missing_blob(s3_bucket, proxy, tmp_path):
    data = os.urandom(9 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    s = _tiered(s3_bucket, tmp_path)
    proxy.fail("POST", f"/p/{layout.blob_path(sha)}\\?uploadId=", times=None, code=404)  # every completion lost
    publish(s, KEY_A, {"model.pt": data})
    [(key, reason)] = s.push_failures
    assert key == KEY_A
    assert reason.startswith(f"upload of blob {sha[:16]} to s3://{s3_bucket}/p: "), reason
    assert "missing" not in reason
    assert not s.remote.lookup(KEY_A).hit


def test_a_large_blob_goes_up_in_parts_and_comes_down_in_ranges_verified(s3_bucket, s3_env, proxy, tmp_path):
    data = os.urandom(12 * MIB + 3)
    sha = hashlib.sha256(data).hexdigest()
    rel = layout.blob_path(sha)
    src = tmp_path / "blob"
    src.write_bytes(data)
    s = RemoteStore(f"s3://{s3_bucket}/p", SMALL, cache_dir=tmp_path / "c")
    assert s.put_blob(sha, src) is True
    parts = [p for m, p, _ in proxy.seen if m == "PUT" and rel in p and "partNumber=" in p]
    assert len(parts) == 3  # 5 + 5 + 2 MiB
    before = len(proxy.seen)
    dest = tmp_path / "out" / "blob"
    s.get_blob(sha, dest)
    assert dest.read_bytes() == data
    got = sorted(m for m, p, _ in proxy.seen[before:] if rel in p and m != "POST")  # (the completion is logged late)
    assert got == ["GET"] * 3  # three ranges, no HEAD
    # bytes that do not hash to the name: nothing is left in place, no temporary file either
    s3_env.client().put_object(Bucket=s3_bucket, Key=f"p/{rel}", Body=data[:-1] + b"x")
    bad = tmp_path / "bad" / "blob"
    with pytest.raises(ValueError, match="hashes to"):
        s.get_blob(sha, bad)
    assert list(bad.parent.iterdir()) == []


def test_transfer_settings_are_checked(tmp_path):
    from neuron_build.errors import UserError
    from neuron_build.store.wire import WireSettings

    got, rest = WireSettings.from_options({"multipart_chunksize": 16 * MIB, "max_concurrency": 4, "profile": "x"})
    assert (got.multipart_threshold, got.multipart_chunksize, got.max_concurrency) == (8 * MIB, 16 * MIB, 4)
    assert rest == {"profile": "x"}
    with pytest.raises(UserError, match=r"multipart_chunksize = 1024 is not a whole number from 5242880 \(5 MiB\) "
                                        r"to 5368709120 \(5 GiB\), S3's part sizes"):
        WireSettings.from_options({"multipart_chunksize": 1024})
    assert WireSettings().multipart_copy_threshold == 5 << 30  # S3's CopyObject copies at most 5 GiB
    with pytest.raises(UserError, match=r"multipart_copy_threshold = 6442450944 is not a whole number from 5242880 "
                                        r"\(5 MiB\) to 5368709120 \(5 GiB\), S3's CopyObject limit"):
        WireSettings.from_options({"multipart_copy_threshold": 6 << 30})


def test_a_refresh_above_the_copy_threshold_is_a_multipart_copy(s3_bucket, s3_env, proxy, tmp_path):
    """A blob found there is refreshed by a copy onto itself; CopyObject copies at most 5 GB, so above
    ``multipart_copy_threshold`` it is a multipart copy (UploadPartCopy)."""
    data = os.urandom(6 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    rel, src = layout.blob_path(sha), tmp_path / "blob"
    src.write_bytes(data)
    cli = s3_env.client()
    for threshold, parts, copies in ((5 * MIB, 2, 0), (None, 0, 1)):
        cli.delete_object(Bucket=s3_bucket, Key=f"p/{rel}")
        opts = {**SMALL, "multipart_threshold": 8 * MIB} | ({"multipart_copy_threshold": threshold} if threshold else {})
        s = RemoteStore(f"s3://{s3_bucket}/p", opts, cache_dir=tmp_path / "c")
        assert s.put_blob(sha, src) is True  # one PUT (below the upload threshold)
        etag = cli.head_object(Bucket=s3_bucket, Key=f"p/{rel}")["ETag"]
        before = len(proxy.seen)
        assert s.put_blob(sha, src) is False  # there: verified, then refreshed
        puts = [p for m, p, st in proxy.seen[before:] if m == "PUT" and rel in p and st == 200]  # (not the 412)
        assert (sum("partNumber=" in p for p in puts), sum("partNumber=" not in p for p in puts)) == (parts, copies)
        head = cli.head_object(Bucket=s3_bucket, Key=f"p/{rel}")
        assert head["ContentLength"] == len(data) and (head["ETag"] != etag) == bool(parts)  # a multipart ETag
        assert cli.get_object(Bucket=s3_bucket, Key=f"p/{rel}")["Body"].read() == data


_PULL_ONE = """
import sys
from pathlib import Path
from neuron_build.store.remote import RemoteStore
from neuron_build.store.ranged import resumable
s = RemoteStore(sys.argv[1], {"multipart_chunksize": 5 << 20, "max_concurrency": 2}, cache_dir=sys.argv[2])
with resumable(Path(sys.argv[3])) as ours:
    print("resuming" if ours else "not resuming", flush=True)
    s.get_blob(sys.argv[4], Path(sys.argv[5]))
"""


def test_a_download_killed_midway_resumes_from_the_ranges_it_has(s3_bucket, s3_env, proxy, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers.faultkit import cli_env, wait_for

    data = os.urandom(30 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    rel = layout.blob_path(sha)
    s3_env.client().put_object(Bucket=s3_bucket, Key=f"p/{rel}", Body=data)
    partial, dest = tmp_path / "partial", tmp_path / "serve" / "model.pt"
    side = partial / f"{sha}.parts.json"
    args = [sys.executable, "-c", _PULL_ONE, f"s3://{s3_bucket}/p", str(tmp_path / "c"), str(partial), sha, str(dest)]
    proxy.fail("GET", f"/p/{rel}", times=None, when=lambda: time.sleep(0.4) or False)  # a slow link: never fails
    p = subprocess.Popen(args, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: side.exists() and json.loads(side.read_text())["done"] >= 15 * MIB, timeout=120,
                 what="half of the blob downloaded")
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    done = json.loads(side.read_text())["done"]
    assert done < len(data) and not dest.exists() and list(dest.parent.iterdir()) == []  # no half file in place
    proxy.rules.clear()
    before = sum(1 for m, path, _ in proxy.seen if m == "GET" and rel in path)
    r = subprocess.run(args, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert dest.read_bytes() == data
    again = sum(1 for m, path, _ in proxy.seen if m == "GET" and rel in path) - before
    assert again * 5 * MIB < 0.6 * len(data), (again, done)  # only the ranges it did not have
    assert not partial.exists()  # the partial file became the blob; the folder, empty, went


def test_two_processes_pulling_into_one_partial_folder_do_not_share_it(s3_bucket, s3_env, proxy, tmp_path):
    """Two pulls into the same destination use the same ``.<dest>.partial/``: the second does not resume (the
    first holds the folder's lock, ``.lock`` in it), so neither writes into the other's partial file (before: both wrote one
    file, and the second kept writing into the first's blob after it was moved into place)."""
    import subprocess
    import sys

    from tests.helpers.faultkit import cli_env

    data = os.urandom(12 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    rel = layout.blob_path(sha)
    s3_env.client().put_object(Bucket=s3_bucket, Key=f"p/{rel}", Body=data)
    partial = tmp_path / "partial"
    released = threading.Event()
    proxy.fail("GET", f"/p/{rel}", times=None, when=lambda: released.wait(120) and False)  # held until both began

    def pull(name: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _PULL_ONE, f"s3://{s3_bucket}/p", str(tmp_path / f"c-{name}"),
                                 str(partial), sha, str(tmp_path / name / "model.pt")],
                                env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = pull("a")
    try:
        assert first.stdout.readline().strip() == "resuming"  # it holds the folder, its first range on the way
        second = pull("b")
        assert second.stdout.readline().strip() == "not resuming"  # the folder is the first's
    finally:
        released.set()
    outs = [p.communicate(timeout=180)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert (tmp_path / "a" / "model.pt").read_bytes() == data
    assert (tmp_path / "b" / "model.pt").read_bytes() == data
    assert not partial.exists()  # the first's partial file became its blob; the folder, empty, went


@pytest.mark.parametrize("how", ["direct", "page cache", "refused"])
def test_the_writer_of_a_download_writes_every_range_in_place(tmp_path, monkeypatch, how):
    """Ranges go to the file through O_DIRECT where the offsets are aligned (the unaligned tail through the
    page cache), through the page cache when the range size is not aligned, and the rest through the page
    cache when the file system refuses a direct write (EINVAL)."""
    import errno

    from neuron_build.store import ranged

    chunk = 2 * ranged.ALIGN + (1 if how == "page cache" else 0)
    data = os.urandom(3 * chunk + 100)
    path = tmp_path / "f"
    if how == "refused":
        real = os.pwrite

        def pwrite(fd, buf, at):
            if fd == out.direct:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real(fd, buf, at)

        monkeypatch.setattr(ranged.os, "pwrite", pwrite)
    with open(path, "wb") as f:
        out = ranged._Writer(f.fileno(), path, 0, chunk)
        assert (out.direct is not None) == (how != "page cache")
        for at in range(0, len(data), chunk):
            piece = data[at:at + chunk]
            out.write([piece[:100], piece[100:]])  # (a range comes in pieces)
        assert (out.direct is None) == (how != "direct")
        out.close()
    assert path.read_bytes() == data
