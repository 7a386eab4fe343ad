"""Pull: a release verified into a folder, tampered objects refused, only its own folder replaced, and a release this host cannot load refused."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from neuron_build.errors import UserError
from neuron_build.release import (
    promote,
    pull,
)
from neuron_build.release.pull import MARKER
from neuron_build.store import layout
from tests.helpers.cli import run_cli
from tests.helpers.releases import blob_of, ctx, make, rebuilt_with, tree


def test_pull_verifies_and_refuses_tampered_object(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve" / "tiny"
    pulled = pull(store, "tiny", "dev", dest, settings)
    assert (pulled.release, pulled.channel, pulled.channel_version) == (r1["id"], "dev", 1)
    doc = pulled.to_json()
    assert list(doc)[:3] == ["format", "release", "model"] and "textgen" not in doc and "serving" not in doc
    assert sorted(tree(dest)) == [MARKER, "b1/manifest.json", "b1/model.pt", "b4/manifest.json", "b4/model.pt",
                                  "release.json"]  # no worker.log: logs are not part of a release
    assert json.loads((dest / "release.json").read_text()) == doc
    marker = json.loads((dest / MARKER).read_text())
    assert (marker["release"], marker["channel"], marker["files"]) == (
        r1["id"], "dev", ["b1/manifest.json", "b1/model.pt", "b4/manifest.json", "b4/model.pt", "release.json"])
    assert doc["inputs"] == [{"name": "x", "shape": ["batch", 16], "dtype": "fp32", "pad": 0.0}]
    assert [(b["id"], b["sizes"], b["inputs"], b["artifact"], b["loader"]) for b in doc["buckets"]] == [
        ("b1", {"batch": 1}, [{"name": "x", "shape": [1, 16], "dtype": "fp32"}], "b1/model.pt", "torch.jit.load"),
        ("b4", {"batch": 4}, [{"name": "x", "shape": [4, 16], "dtype": "fp32"}], "b4/model.pt", "torch.jit.load")]
    for b in doc["buckets"]:
        for name, ent in b["files"].items():
            data = (dest / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == ent["sha256"] and len(data) == ent["size"]
            assert data == store.path(layout.blob_path(ent["sha256"])).read_bytes()
    # b1 and b4 pin one blob (below): one file on the deploy host, linked at both paths
    assert os.stat(dest / "b1/model.pt").st_ino == os.stat(dest / "b4/model.pt").st_ino

    # tamper one byte of a stored model blob (same size, so only the checksum can tell); the tiny model
    # traces to the same bytes at every batch size, so b1 and b4 share that blob: stored once
    before = tree(dest)
    assert blob_of(store, r1, 0) == blob_of(store, r1, 1)
    victim = blob_of(store, r1, 0)
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    os.chmod(victim, 0o644)
    victim.write_bytes(bytes(raw))
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert (f"tiny/b1/fp32/p1 (key {r1['artifacts'][0]['key'][:12]}): model.pt (blob {victim.name[:16]}...) in "
            f"{store.location} does not match its sha256: the stored blob is damaged; `neuron-build verify --deep "
            f"--repair` (moves the damaged blob to quarantine/), then `neuron-build build tiny/b1/fp32/p1` compiles it "
            f"again; unless that compile is byte-identical (AOTInductor's is not) it is a new artifact the release "
            f"does not pin: make and promote a new release (`neuron-build release tiny && neuron-build promote tiny "
            f"RELEASE --to dev`)") == str(ei.value)
    assert tree(dest) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tiny"]  # no staging folder left behind
    # the CLI says the same, exit 2, and a fresh DIR is not created
    fresh = tmp_path / "serve2"
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", str(fresh), "-c", str(proj))
    assert r.returncode == 2 and "does not match its sha256" in r.stderr and "Traceback" not in r.stderr
    assert not fresh.exists()

    # a missing blob
    victim.unlink()
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert str(ei.value) == (
        f"tiny/b1/fp32/p1 (key {r1['artifacts'][0]['key'][:12]}): model.pt (blob {victim.name[:16]}...) is missing "
        f"from the store {store.location}; `neuron-build build tiny/b1/fp32/p1` compiles it again; unless that "
        f"compile is byte-identical (AOTInductor's is not) it is a new artifact the release does not pin: make and "
        f"promote a new release (`neuron-build release tiny && neuron-build promote tiny RELEASE --to dev`), or "
        f"promote another release")
    assert tree(dest) == before


def test_pull_replaces_its_own_folder_and_keeps_what_it_did_not_write(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    (dest / "notes.txt").write_text("written by the operator")
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    assert str(ei.value) == (f"--dest {dest} holds files the earlier pull did not write (notes.txt); a pull "
                             f"replaces only its own files: move them out of the folder, then pull again")
    assert (dest / "notes.txt").read_text() == "written by the operator"
    assert json.loads((dest / "release.json").read_text())["release"] == r1["id"]
    (dest / "notes.txt").unlink()
    doc = pull(store, "tiny", "dev", dest, settings)
    assert doc.release == r2["id"] and doc.dtype == "bf16"
    assert json.loads((dest / "release.json").read_text())["release"] == r2["id"]
    assert json.loads((dest / MARKER).read_text())["release"] == r2["id"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "serve"]  # no staging or old folder left
    with pytest.raises(UserError, match="channel tiny/staging holds no release"):
        pull(store, "tiny", "staging", tmp_path / "x", settings)


def test_an_interrupted_pull_leaves_the_previous_one_intact(proj, tmp_path, monkeypatch):
    _, _, store, settings = ctx(proj)
    r1, r2 = make(proj), make(proj, "bf16")
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    before = tree(dest)
    promote(store, settings, "tiny", "dev", release=r2["id"], allow_unvalidated=True, reason="not validated in tests")
    real, n = store.get_blob, []

    def dies_midway(sha, path):
        n.append(sha)
        real(sha, path)
        raise KeyboardInterrupt  # Ctrl-C after the first file (b4's is a link of it: not fetched again)

    monkeypatch.setattr(store, "get_blob", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        pull(store, "tiny", "dev", dest, settings)
    assert tree(dest) == before and sorted(p.name for p in tmp_path.iterdir()) == ["proj", "serve"]


def test_pull_never_replaces_a_folder_it_did_not_write(proj, tmp_path):
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("important")
    with pytest.raises(UserError, match="is a folder with other content"):
        pull(store, "tiny", "dev", keep, settings)
    assert (keep / "notes.txt").read_text() == "important" and sorted(os.listdir(keep)) == ["notes.txt"]
    with pytest.raises(UserError, match="--dest is empty"):
        pull(store, "tiny", "dev", "", settings)
    with pytest.raises(UserError, match="notes.txt is a file, not a folder"):
        pull(store, "tiny", "dev", keep / "notes.txt" / "sub", settings)
    # an earlier pull's folder is replaced by the new pull
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    assert pull(store, "tiny", "dev", dest, settings).release == r1["id"]


def test_pull_refuses_a_release_this_host_cannot_load(proj, tmp_path):
    import importlib.metadata as md

    torch_v = md.version("torch")
    rebuilt_with(proj, "2.99.0")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    assert r1["toolchain"]["torch"] == "2.99.0"
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    with pytest.raises(UserError) as ei:
        pull(store, "tiny", "dev", dest, settings)
    msg = str(ei.value)
    assert msg.startswith(f"release {r1['id']} of tiny (dev): built with torch 2.99.0, but this host has "
                          f"torch {torch_v}; a TorchScript module (.pt) needs torch>=2.99,<3")
    assert "\n" not in msg and not dest.exists()
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", str(dest), "-c", str(proj))
    assert r.returncode == 2 and "built with torch 2.99.0, but this host has torch" in r.stderr


def test_load_refuses_an_artifact_built_for_another_torch(proj, tmp_path):
    import importlib.metadata as md

    from neuron_build.artifact import AOTI_LOADER, LOAD_RULES, load_requirements, version_problem
    from neuron_build.runtime import BucketedModel

    torch_v = md.version("torch")
    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    pull(store, "tiny", "dev", dest, settings)
    assert BucketedModel.load(dest).buckets  # the host's own torch loads it
    doc = json.loads((dest / "release.json").read_text())
    doc["toolchain"]["torch"] = "2.99.1"
    (dest / "release.json").write_text(json.dumps(doc))
    with pytest.raises(UserError) as ei:
        BucketedModel.load(dest)
    assert str(ei.value).startswith(f"{dest / 'release.json'} (release {r1['id']} of tiny): built with torch "
                                    f"2.99.1, but this host has torch {torch_v}")
    # an AOTInductor package needs the very same torch release; the rule is a table by artifact kind
    for b in doc["buckets"]:
        b["loader"] = AOTI_LOADER
    doc["toolchain"]["torch"] = "2.13.9"
    (dest / "release.json").write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"built with torch 2\.13\.9, but this host has torch .*AOTInductor "
                                        r"package \(\.pt2\) needs torch==2\.13\.9"):
        BucketedModel.load(dest)
    assert set(LOAD_RULES) == {"aoti", "torchscript", "neuron", "compile-cache"}
    assert load_requirements("neuron", {"torch": "2.13.0", "torch-neuronx": "2.13.0.2.30.4217"}) == {
        "torch": "==2.13.*", "torch-neuronx": ">=2.13.0.2.30.4217"}
    assert version_problem("neuron", {"torch": "2.13.0", "torch-neuronx": "2.13.0.2.30"},
                           {"torch": "2.13.1", "torch-neuronx": None}, "x") == (
        "x: built with torch-neuronx 2.13.0.2.30, but torch-neuronx is not installed here; this Neuron "
        "TorchScript module with NEFF (.pt) needs torch-neuronx>=2.13.0.2.30")



def test_a_release_walks_from_promote_to_pull_to_a_typed_record_to_a_loaded_model(proj, tmp_path):
    """promote -> pull (which writes the record) -> read_pulled (the record, typed and checked) ->
    BucketedModel.load (which reads that same record) -> a call routed to a bucket."""
    import torch

    from neuron_build.runtime import BucketedModel, PulledRelease, read_pulled

    _, _, store, settings = ctx(proj)
    r1 = make(proj)
    promote(store, settings, "tiny", "dev", release=r1["id"], allow_unvalidated=True, reason="not validated in tests")
    dest = tmp_path / "serve"
    written = pull(store, "tiny", "dev", dest, settings)
    rec = read_pulled(dest, "pull it")
    assert isinstance(rec, PulledRelease) and rec == written
    assert (rec.release, rec.model, rec.channel, rec.channel_version, rec.backend, rec.dims) == (
        r1["id"], "tiny", "dev", 1, "torchscript", ["batch"])
    m = BucketedModel.load(dest)
    assert m.release == rec
    assert [b.id for b in m.buckets] == ["b1", "b4"]
    out = m(torch.ones(3, 16))
    assert tuple(out.shape[:1]) == (3,) and m.choose([[3, 16]]) == "b4"
