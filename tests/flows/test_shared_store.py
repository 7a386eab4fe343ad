"""A shared store as users meet it: checkouts on other paths (other hosts) with their own local stores
read through one remote (``[build] remote``); push, fetch, pull with only the URL, tampering, failed pushes,
an unreachable endpoint. The remote is a bucket on a real S3 endpoint (``remote``) or a folder by
``file://`` URL (``remote_url``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import compiles_in_log, run_cli
from tests.helpers.projects import write_tiny_project

MATRIX = '''
[build]
backend = "torchscript"
timeout_s = 120
heartbeat_s = 1
remote = "{remote}"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.tiny]
factory = "tinylib.tiny:build"
kwargs = {{ width = 16 }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [1, 4] }}

[release]
channels = ["dev", "prod"]
'''


def checkout(root: Path, remote: str, buckets: str = "1, 4") -> Path:
    """A project of one target per batch bucket at ``root`` whose store is ``<root>/artifacts`` read
    through ``remote``."""
    cfg = write_tiny_project(root)
    cfg.write_text(MATRIX.format(remote=remote).replace("batch = [1, 4]", f"batch = [{buckets}]"))
    return cfg


class Remote:
    """A shared store under test: its URL, and a way to list and overwrite its blobs from outside (as rot
    or a tamperer would)."""

    def __init__(self, url: str, blobs, overwrite):
        self.url, self.blobs, self.overwrite = url, blobs, overwrite


def _folder_remote(tmp_path: Path) -> Remote:
    root = tmp_path / "shared"
    return Remote(root.as_uri(), lambda: sorted(p.name for p in (root / "cas").rglob("*") if p.is_file()),
                  lambda sha, data: (root / "cas" / sha[:2] / sha).write_bytes(data))


def _s3_remote(request) -> Remote:
    bucket = request.getfixturevalue("s3_bucket")
    client = request.getfixturevalue("s3_env").client()

    def blobs() -> list[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="team/cas/")
        return sorted(o["Key"].rsplit("/", 1)[-1] for page in pages for o in page.get("Contents", []))

    def overwrite(sha: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"team/cas/{sha[:2]}/{sha}", Body=data)

    return Remote(f"s3://{bucket}/team", blobs, overwrite)


@pytest.fixture
def remote(request) -> Remote:
    """The shared store as CI and deploy hosts meet it: a bucket on a real S3 endpoint (moto's server).
    (The other tests share a folder by ``file://`` URL: the same code path, the contract suite runs both.)"""
    return _s3_remote(request)


@pytest.fixture
def remote_url(tmp_path: Path) -> str:
    return _folder_remote(tmp_path).url


def plan(cfg: Path) -> dict[str, dict]:
    r = run_cli("plan", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    return {t["target"]: t for t in json.loads(r.stdout)["targets"]}


def test_a_second_checkout_compiles_nothing_and_fetch_makes_it_local(tmp_path, remote):
    remote_url = remote.url
    a, b = checkout(tmp_path / "host-a" / "proj", remote_url), checkout(tmp_path / "elsewhere" / "b", remote_url)
    r = run_cli("build", "-c", str(a))
    assert r.returncode == 0, r.stderr
    assert "2 targets: 2 built, 0 cached, 0 failed" in r.stdout

    states = plan(b)
    assert {t["state"] for t in states.values()} == {"cached"}
    assert {t["location"] for t in states.values()} == {"remote"}
    r = run_cli("build", "-c", str(b))
    assert r.returncode == 0, r.stderr
    assert "2 targets: 0 built, 2 cached (2 downloaded from the remote store), 0 failed" in r.stdout
    assert compiles_in_log(b.parent / ".neuron-build") == []
    assert {t["location"] for t in plan(b).values()} == {"local"}
    r = run_cli("verify", "--deep", "-c", str(b))
    assert r.returncode == 0, r.stdout + r.stderr

    c = checkout(tmp_path / "offline-deploy" / "c", remote_url)  # fetch: before going offline
    r = run_cli("fetch", "--json", "-c", str(c))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["copied"]) == 2 and doc["failed"] == [] and doc["bytes"] > 0
    assert {t["location"] for t in plan(c).values()} == {"local"}
    r = run_cli("fetch", "--json", "-c", str(c))  # a second fetch has nothing to do
    assert json.loads(r.stdout)["copied"] == [] and len(json.loads(r.stdout)["present"]) == 2


def test_a_tampered_remote_blob_is_refused_and_the_rebuild_replaces_it(tmp_path, remote):
    remote_url = remote.url
    a, b = checkout(tmp_path / "a", remote_url, "1"), checkout(tmp_path / "b", remote_url, "1")
    assert run_cli("build", "-c", str(a)).returncode == 0
    blobs = remote.blobs()
    assert len(blobs) == 1
    size = json.loads((next((a.parent / "artifacts" / "ac").rglob("*.json"))).read_text())["files"]["model.pt"]["size"]
    remote.overwrite(blobs[0], b"X" * size)  # same size: only the digest tells

    r = run_cli("build", "-c", str(b))
    assert r.returncode == 0, r.stdout + r.stderr
    warning = next(line for line in r.stderr.splitlines() if "remote artifact" in line)
    assert "not used" in warning and "rot or tampering" in warning, warning  # the warning names why
    assert compiles_in_log(b.parent / ".neuron-build") == ["tiny/b1/fp32/p1"]  # rebuilt, not served
    # the rebuild's push replaced the entry that pinned the tampered blob: a third host downloads it
    c = checkout(tmp_path / "c", remote_url, "1")
    r = run_cli("build", "-c", str(c))
    assert r.returncode == 0 and "(1 downloaded from the remote store)" in r.stdout, r.stdout + r.stderr
    assert run_cli("verify", "--deep", "-c", str(c)).returncode == 0


def test_a_failed_push_is_reported_and_retried_by_the_next_build(tmp_path):
    # the remote opens (a folder), but its blob folder is a file: every upload fails (a remote that cannot
    # be opened at all stops the build in one line instead: tests/flows/test_cli_tracebacks.py)
    remote = tmp_path / "remote"
    remote.mkdir()
    blocker = remote / "cas"
    blocker.write_text("a file where the remote's blob folder should be\n")
    cfg = checkout(tmp_path / "a", remote.as_uri(), "1")
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout
    assert "NOT PUSHED 1 artifact to" in r.stdout and "the next build (or `neuron-build push`)" in r.stdout

    blocker.unlink()
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert compiles_in_log(cfg.parent / ".neuron-build").count("tiny/b1/fp32/p1") == 1
    other = checkout(tmp_path / "b", remote.as_uri(), "1")
    assert {t["location"] for t in plan(other).values()} == {"remote"}


def test_push_uploads_an_offline_build(tmp_path, remote_url):
    cfg = checkout(tmp_path / "a", remote_url, "1")
    offline = cfg.read_text().replace(f'remote = "{remote_url}"\n', "")
    cfg.write_text(offline)
    assert run_cli("build", "-c", str(cfg)).returncode == 0
    cfg.write_text(offline.replace("heartbeat_s = 1\n", f'heartbeat_s = 1\nremote = "{remote_url}"\n'))
    r = run_cli("push", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "pushed 1 artifact" in r.stdout and "0 failed" in r.stdout
    r = run_cli("push", "--json", "-c", str(cfg))
    assert json.loads(r.stdout)["copied"] == [] and len(json.loads(r.stdout)["present"]) == 1
    other = checkout(tmp_path / "b", remote_url, "1")
    assert {t["location"] for t in plan(other).values()} == {"remote"}


def test_push_without_a_remote_says_what_to_add(tiny):
    r = run_cli("push", "-c", str(tiny))
    assert r.returncode == 2
    assert "no [build] remote" in r.stderr and 'remote = "s3://bucket/prefix"' in r.stderr


def test_pull_with_only_the_url(tmp_path, remote_url):
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.release import create_release, promote
    from neuron_build.workspace import Workspace

    cfg = checkout(tmp_path / "ci", remote_url, "1")
    assert run_cli("build", "-c", str(cfg)).returncode == 0
    project = load_project(cfg)
    b = Builder(Workspace(project))
    rel = create_release(b.ws, "tiny", "fp32", "p1")
    promote(b.ws.store, project.config.release, "tiny", "dev", release=rel.id, allow_unvalidated=True, reason="not validated in tests")
    shutil.rmtree(cfg.parent / "artifacts")  # the CI runner is gone; only the remote is left

    host = tmp_path / "deploy-host"
    host.mkdir()
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", "serve", "--store", remote_url, cwd=host)
    assert r.returncode == 0, r.stderr
    doc = json.loads((host / "serve" / "release.json").read_text())
    assert doc["release"] == rel.id and len(doc["buckets"]) == 1
    for bucket in doc["buckets"]:
        assert bucket["files"]
        for name, ent in bucket["files"].items():  # names are relative to the pulled folder
            assert (host / "serve" / name).stat().st_size == ent["size"]


def test_a_remote_that_is_not_a_url_is_a_config_error(tmp_path):
    cfg = checkout(tmp_path / "a", "shared-folder")
    r = run_cli("plan", "-c", str(cfg))
    assert r.returncode == 2
    assert "build.remote" in r.stderr and "is not a URL" in r.stderr
    cfg.write_text(MATRIX.format(remote="s3://A_bucket/x"))
    r = run_cli("plan", "-c", str(cfg))
    assert r.returncode == 2 and "is not an S3 bucket name" in r.stderr


def test_an_unreachable_remote_fails_open_and_the_push_waits_for_it(tmp_path, s3_env, s3_bucket, monkeypatch):
    from tests.helpers.s3 import free_port

    cfg = checkout(tmp_path / "a", f"s3://{s3_bucket}/team", "1")
    down = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens there
    r = run_cli("build", "-c", str(cfg), env=down)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout  # the build went on locally
    warnings = [line for line in r.stderr.splitlines() if "cannot be read" in line]
    assert len(warnings) == 1 and f"s3://{s3_bucket}/team" in warnings[0], r.stderr
    assert "NOT PUSHED 1 artifact" in r.stdout
    assert s3_env.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0  # nothing half-published

    r = run_cli("build", "-c", str(cfg))  # the endpoint is back: the pending push goes up, nothing compiles
    assert r.returncode == 0, r.stdout + r.stderr
    assert compiles_in_log(cfg.parent / ".neuron-build") == ["tiny/b1/fp32/p1"]
    other = checkout(tmp_path / "b", f"s3://{s3_bucket}/team", "1")
    assert {t["location"] for t in plan(other).values()} == {"remote"}


def test_gc_of_the_remote_keeps_what_releases_and_current_targets_name(s3_bucket):
    import hashlib

    from neuron_build.store import open_store
    from neuron_build.store.gc import collect_garbage
    from tests.helpers.store import publish

    store = open_store(f"s3://{s3_bucket}/team")
    pinned, current, stale = "a1" * 32, "c3" * 32, "b2" * 32
    for key, data in ((pinned, b"released bytes"), (current, b"current bytes"), (stale, b"stale bytes")):
        publish(store, key, {"model.pt": data})
    sha = {k: hashlib.sha256(d).hexdigest() for k, d in
           ((pinned, b"released bytes"), (current, b"current bytes"), (stale, b"stale bytes"))}
    store.put_release("m", "r-0001", {"id": "r-0001", "artifacts": [
        {"target": "m/b1/fp32/p", "key": pinned, "files": {"model.pt": {"sha256": sha[pinned], "size": 14}}}]})

    young = collect_garbage(store, keep_keys=[current], keep_days=7, current_targets=())  # everything is minutes old
    assert young.removed == [] and young.kept_young == 1 and young.referenced == 2

    dry = collect_garbage(store, keep_keys=[current], keep_days=0, dry_run=True, current_targets=())
    assert sorted(r.kind for r in dry.removed) == ["blob", "object"]
    assert store.lookup(stale).hit  # a dry run removes nothing

    rep = collect_garbage(store, keep_keys=[current], keep_days=0, current_targets=())
    assert [(r.kind, r.key) for r in rep.removed if r.kind == "object"] == [("object", stale)]
    assert [r.path for r in rep.removed if r.kind == "blob"] == [f"cas/{sha[stale][:2]}/{sha[stale]}"]
    assert rep.failed == []
    assert store.keys() == sorted([pinned, current])
    assert store.blob_size(sha[stale]) is None and store.blob_size(sha[pinned]) == 14
    assert store.lookup(pinned).hit and store.lookup(current).hit


def test_gc_remote_without_a_remote_says_what_to_add(tiny):
    r = run_cli("gc", "--remote", "--dry-run", "-c", str(tiny))
    assert r.returncode == 2
    assert "no [build] remote" in r.stderr and "drop --remote" in r.stderr
