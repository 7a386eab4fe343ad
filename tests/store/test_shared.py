"""A shared store as users meet it: checkouts on other paths (other hosts) with their own local stores
read through one remote (``[build] remote``); push, fetch, pull with only the URL, tampering, failed pushes.

Each test runs against a ``file://`` remote (any fsspec URL behaves the same through the contract); the S3
endpoint's cases are the ``remote_url`` fixture's other parameter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import compiles_in_log, run_cli, write_tiny_project

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


@pytest.fixture
def remote_url(tmp_path: Path) -> str:
    return (tmp_path / "shared").as_uri()


def plan(cfg: Path) -> dict[str, dict]:
    r = run_cli("plan", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    return {t["target"]: t for t in json.loads(r.stdout)}


def test_a_second_checkout_compiles_nothing_and_fetch_makes_it_local(tmp_path, remote_url):
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


def test_a_tampered_remote_blob_is_refused_and_the_rebuild_replaces_it(tmp_path, remote_url):
    a, b = checkout(tmp_path / "a", remote_url, "1"), checkout(tmp_path / "b", remote_url, "1")
    assert run_cli("build", "-c", str(a)).returncode == 0
    shared = Path(remote_url.removeprefix("file://"))
    blobs = sorted(p for p in (shared / "cas").rglob("*") if p.is_file())
    assert blobs
    victim = blobs[0]
    victim.write_bytes(b"X" * victim.stat().st_size)  # same size: only the digest tells

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
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the remote folder should be\n")
    cfg = checkout(tmp_path / "a", (blocker / "store").as_uri(), "1")
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout
    assert "NOT PUSHED 1 artifact to" in r.stdout and "the next build (or `neuron-build push`)" in r.stdout

    blocker.unlink()
    blocker.mkdir()
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert compiles_in_log(cfg.parent / ".neuron-build").count("tiny/b1/fp32/p1") == 1
    other = checkout(tmp_path / "b", (blocker / "store").as_uri(), "1")
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

    cfg = checkout(tmp_path / "ci", remote_url, "1")
    assert run_cli("build", "-c", str(cfg)).returncode == 0
    project = load_project(cfg)
    b = Builder(project)
    rel = create_release(b, "tiny", "fp32", "p1")
    promote(b.store, project.config.release, "tiny", "dev", release=rel["id"], allow_unvalidated=True)
    shutil.rmtree(cfg.parent / "artifacts")  # the CI runner is gone; only the remote is left

    host = tmp_path / "deploy-host"
    host.mkdir()
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", "serve", "--store", remote_url, cwd=host)
    assert r.returncode == 0, r.stderr
    doc = json.loads((host / "serve" / "release.json").read_text())
    assert doc["release"] == rel["id"] and len(doc["buckets"]) == 1
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
