"""The trust boundary: records in a store whose names would become paths outside the destination or the store
(``../../x``, absolute paths, separators in ids) are refused in one line, and nothing is written outside.

The records are hand-crafted into a local folder store and into a real S3 endpoint (moto server), as anyone
who can write to a shared bucket could; ``pull`` runs as a user runs it (the CLI in a subprocess).
"""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path

import pytest

from neuron_build.errors import NeuronBuildError
from neuron_build.release.pull import pull
from neuron_build.store import open_store
from neuron_build.store.digests import SELF_DIGEST, manifest_digest
from neuron_build.util import canonical_json, sha256_hex
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project

BLOB = b"not a model, but bytes with a digest\n"
SHA = sha256_hex(BLOB)
KEY = "ab" * 32


def tree(root: Path) -> set[str]:
    """Every path under ``root`` (files, folders, symlinks), relative."""
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def release_record(rid: str, bucket_id: str, name: str) -> dict:
    return {"id": rid, "format": 1, "model": "tiny", "dtype": "fp32", "profile": "p1", "backend": "torchscript",
            "hardware_target": "trn1",
            "artifacts": [{"target": "tiny/b1/fp32/p1", "key": KEY, "bucket": {"batch": 1}, "bucket_id": bucket_id,
                           "inputs": [{"name": "x", "shape": [1, 16], "dtype": "fp32"}],
                           "files": {name: {"sha256": SHA, "size": len(BLOB)}},
                           "artifact": name, "loader": "torch.jit.load"}],
            "toolchain": {"torch": version("torch")},
            "runtime": {"dims": ["batch"], "inputs": [{"name": "x", "shape": ["batch", 16], "dtype": "fp32"}],
                        "truncate": False, "convert_dtypes": False},
            "metrics": {}, "created": "2026-12-01T00:00:00Z", "creator": "mallory"}


def plant(store, tmp_path: Path, rid: str, bucket_id: str, name: str, pointer_release: str | None = None) -> None:
    """Write a blob, a release record ``rid`` naming it as ``bucket_id/name``, and channel ``tiny/prod``
    pointing at ``pointer_release`` (default ``rid``), straight through the store's object primitives."""
    src = tmp_path / "blob.bin"
    src.write_bytes(BLOB)
    store.put_blob(SHA, src)
    store.put_object(f"releases/tiny/{rid.replace('/', '_')}.json", json.dumps(release_record(rid, bucket_id, name)).encode())
    store.put_object("channels/tiny/prod.json", json.dumps(
        {"model": "tiny", "channel": "prod", "release": pointer_release or rid, "version": 1}).encode())


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(store URL or folder, the store): a local folder, or a fresh bucket on the session's S3 server."""
    if request.param == "local":
        loc = str(tmp_path / "store")
    else:
        bucket = request.getfixturevalue("s3_bucket")
        loc = f"s3://{bucket}/team"
    return loc, open_store(loc)


CASES = {
    "dotdot": ("r-0000000000000001", "b1", "../../x"),
    "absolute": ("r-0000000000000002", "b1", "{tmp}/abs/x"),
    "etc": ("r-0000000000000003", "b1", "/etc/neuron-build-trust-test-x"),
    "inner-dotdot": ("r-0000000000000004", "b1", "a/../../x"),
    "bucket-absolute": ("r-0000000000000005", "{tmp}/abs", "model.pt"),
    "bucket-tmp": ("r-0000000000000006", "/tmp/abs", "model.pt"),
    "release-id-slash": ("r-00/../../../x", "b1", "model.pt"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pull_refuses_a_release_record_that_names_paths_outside(where, tmp_path, case):
    loc, store = where
    rid, bid, name = (v.replace("{tmp}", str(tmp_path)) for v in CASES[case])
    plant(store, tmp_path, rid, bid, name)
    (tmp_path / "serve").mkdir()
    before = tree(tmp_path)
    r = run_cli("pull", "tiny", "--channel", "prod", "--dest", str(tmp_path / "serve" / "tiny"), "--store", loc)
    err = r.stderr.strip()
    assert r.returncode == 1, r.stdout + r.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in r.stderr, err
    assert "is refused:" in err and loc.rstrip("/") in err
    what = "channel pointer tiny/prod" if case == "release-id-slash" else f"release {rid!r} of 'tiny'"
    assert err.startswith(f"error: {what} in "), err
    assert tree(tmp_path) == before  # nothing written anywhere (dest, beside it, or the absolute paths)
    assert not os.path.lexists("/etc/neuron-build-trust-test-x") and not os.path.lexists("/tmp/abs")


def test_pull_refuses_a_channel_named_dotdot(where, tmp_path):
    loc, store = where
    plant(store, tmp_path, "r-0000000000000007", "b1", "model.pt")
    # typed by the user: a usage error before the store is read
    r = run_cli("pull", "tiny", "--channel", "..", "--dest", str(tmp_path / "serve"), "--store", loc)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: --channel: channel name '..' may hold only"), r.stderr
    # reached from code: the store's trust boundary refuses the name before it becomes a path
    with pytest.raises(NeuronBuildError) as ei:
        pull(store, "tiny", "..", tmp_path / "serve")
    assert "channel tiny/.. in" in str(ei.value) and "channel '..' is a relative folder reference" in str(ei.value)
    assert not (tmp_path / "serve").exists()


def sealed(raw: dict) -> bytes:
    raw = dict(raw)
    raw[SELF_DIGEST] = manifest_digest(raw)
    return canonical_json(raw)


def manifest_raw(files: dict[str, str]) -> dict:
    return {"format": 1, "key": KEY, "target": "tiny/b1/fp32/p1", "model": "tiny", "bucket": {"batch": 1},
            "dtype": "fp32", "profile": "p1", "backend": "torchscript", "hardware_target": "trn1",
            "key_details": {}, "component_hashes": {},
            "files": {n: {"sha256": SHA, "size": len(BLOB)} for n in files}, "logs": {},
            "metrics": {"status": "PASS", "compile_time_s": 1.0}, "toolchain": {}, "compiler": {},
            "created": "2026-12-01T00:00:00Z", "host": "h"}


@pytest.mark.parametrize("name", ["../../../../x", "a/../../../../../x", "{tmp}/abs/x"])
def test_a_manifest_naming_paths_outside_is_never_served_nor_viewed(where, tmp_path, name):
    from neuron_build.trust import UntrustedRecord

    loc, store = where
    name = name.replace("{tmp}", str(tmp_path))
    src = tmp_path / "blob.bin"
    src.write_bytes(BLOB)
    store.put_blob(SHA, src)
    store.put_object(f"ac/{KEY[:2]}/{KEY}.json", sealed(manifest_raw({name: SHA})))
    before = tree(tmp_path)
    found = store.lookup(KEY)
    assert not found.hit and found.damage.startswith("manifest is refused: files name"), found.damage
    with pytest.raises(UntrustedRecord) as e:
        store.artifact_dir(KEY)  # a view (local: hard links; S3: downloads into the cache)
    assert str(e.value).startswith(f"manifest of key {KEY[:12]} in ") and "\n" not in str(e.value)
    assert tree(tmp_path) == before


def test_a_manifest_without_its_own_digest_is_not_trusted(where, tmp_path):
    loc, store = where
    src = tmp_path / "blob.bin"
    src.write_bytes(BLOB)
    store.put_blob(SHA, src)
    store.put_object(f"ac/{KEY[:2]}/{KEY}.json", canonical_json(manifest_raw({"model.pt": SHA})))
    found = store.lookup(KEY)
    assert not found.hit and found.damage == ("manifest has no manifest_sha256 of its own (not sealed by "
                                              "neuron-build: not trusted)")
    store.put_object(f"ac/{KEY[:2]}/{KEY}.json", sealed(manifest_raw({"model.pt": SHA})))
    assert store.lookup(KEY).hit  # the same manifest, sealed: served


def pulled_folder(tmp_path: Path) -> Path:
    loc = tmp_path / "store"
    plant(open_store(loc), tmp_path, "r-0000000000000008", "b1", "model.pt")
    dest = tmp_path / "serve"
    r = run_cli("pull", "tiny", "--channel", "prod", "--dest", str(dest), "--store", str(loc))
    assert r.returncode == 0, r.stderr
    return dest


@pytest.mark.parametrize("edit", ["artifact", "bucket-id", "symlink"])
def test_load_refuses_a_pulled_release_json_naming_paths_outside(tmp_path, edit):
    from neuron_build.runtime import BucketedModel
    from neuron_build.trust import UntrustedRecord

    dest = pulled_folder(tmp_path)
    outside = tmp_path / "outside.pt"
    outside.write_bytes(BLOB)
    doc = json.loads((dest / "release.json").read_text())
    b = doc["buckets"][0]
    if edit == "artifact":
        b["artifact"] = "../outside.pt"
    elif edit == "bucket-id":
        b["id"] = str(tmp_path)
    else:  # the file a bucket lists replaced by a symlink that leaves the folder
        (dest / "b1" / "model.pt").unlink()
        (dest / "b1" / "model.pt").symlink_to(outside)
    (dest / "release.json").write_text(json.dumps(doc))
    with pytest.raises(UntrustedRecord) as e:
        BucketedModel.load(dest)
    msg = str(e.value)
    assert msg.startswith("release 'r-0000000000000008' of 'tiny' in ") and str(dest / "release.json") in msg
    assert "\n" not in msg


def test_promote_and_rollback_refuse_a_pointer_naming_a_path(tmp_path):
    """A channel pointer whose release (or previous release) is a path is refused by every command that
    follows it, before the release id becomes a path."""

    cfg = write_tiny_project(tmp_path / "p", extra='\n[release]\nchannels = ["dev", "prod"]\n')
    store = open_store(cfg.parent / "artifacts")
    store.put_object("channels/tiny/dev.json", json.dumps(
        {"model": "tiny", "channel": "dev", "release": "r-0000000000000009", "previous": "../../../etc/x",
         "version": 2}).encode())
    for args in (("promote", "tiny", "--from", "dev", "--to", "prod"), ("history", "tiny", "--channel", "dev")):
        r = run_cli(*args, "-c", str(cfg))
        if args[0] == "history":  # a listing of entries: no pointer followed
            assert r.returncode == 0, r.stderr
            continue
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert r.stderr.startswith(f"error: channel pointer tiny/dev in {cfg.parent / 'artifacts'} is refused: "
                                   f"previous '../../../etc/x' holds a path separator"), r.stderr


def test_a_release_id_from_a_history_entry_or_the_command_line_never_becomes_a_path(tmp_path):
    from neuron_build.release.records import get_release
    from neuron_build.trust import UntrustedRecord

    store = open_store(tmp_path / "store")
    outside = tmp_path / "x.json"
    outside.write_text(json.dumps(release_record("r-0000000000000010", "b1", "model.pt")))
    with pytest.raises(UntrustedRecord) as e:
        get_release(store, "tiny", "../../x")  # releases/tiny/../../x.json is tmp_path/x.json
    assert str(e.value).startswith(f"release '../../x' of 'tiny' in {tmp_path / 'store'} is refused: release "
                                   f"'../../x' holds a path separator")


def test_warmup_refuses_a_tampered_pulled_folder_in_one_line(tmp_path):
    dest = pulled_folder(tmp_path)
    doc = json.loads((dest / "release.json").read_text())
    doc["buckets"][0]["files"] = {"../../x": doc["buckets"][0]["files"]["b1/model.pt"]}
    (dest / "release.json").write_text(json.dumps(doc))
    r = run_cli("warmup", str(dest))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr  # the fresh process's line, its code
    assert r.stderr.startswith(f"error: warmup of {dest} failed (exit 1): release 'r-0000000000000008' of 'tiny' "
                               f"in {dest / 'release.json'} is refused: file name '../../x' leaves its folder"), r.stderr
