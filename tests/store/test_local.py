"""What only the local folder store does beyond the contract: views for loading, the read-only flag, the
refusal of the old layout, and that blobs are stored once."""

from __future__ import annotations

import os

import pytest

from neuron_build.errors import UserError
from neuron_build.store import LocalStore, layout, open_store
from neuron_build.store.core import ReadOnlyStore
from tests.helpers.store import FILES, KEY_A, KEY_B, entry, publish


def test_a_view_links_the_blobs_and_is_rebuilt_when_stale(tmp_path):
    s = LocalStore(tmp_path / "store")
    publish(s, KEY_A, FILES)
    view = s.artifact_dir(KEY_A)
    assert view == s.view_dir(KEY_A)
    assert sorted(p.relative_to(view).as_posix() for p in view.rglob("*") if p.is_file()) == [
        ".view.json", "manifest.json", "model.neff", "model.pt", "sub/extra.bin"]
    blob = s.path(layout.blob_path(entry(FILES["model.pt"])["sha256"]))
    assert os.stat(view / "model.pt").st_ino == os.stat(blob).st_ino  # a hard link, not a copy
    # the blob is replaced (healed): the view is stale and rebuilt on the next call
    os.chmod(blob, 0o644)
    blob.write_bytes(b"rotten")
    src = tmp_path / "again"
    src.write_bytes(FILES["model.pt"])
    assert s.put_blob(entry(FILES["model.pt"])["sha256"], src)
    assert os.stat(view / "model.pt").st_ino != os.stat(blob).st_ino
    assert (s.artifact_dir(KEY_A) / "model.pt").read_bytes() == FILES["model.pt"]
    assert os.stat(view / "model.pt").st_ino == os.stat(blob).st_ino
    with pytest.raises(FileNotFoundError):
        s.artifact_dir(KEY_B)


def test_identical_files_are_stored_once(tmp_path):
    s = LocalStore(tmp_path / "store")
    publish(s, KEY_A, FILES)
    publish(s, KEY_B, {"model.pt": FILES["model.pt"], "other.bin": b"other"})
    assert sorted(p.name for p in (tmp_path / "store" / "cas").rglob("*") if p.is_file()) == sorted(
        {entry(b)["sha256"] for b in [*FILES.values(), b"other"]})


def test_a_read_only_store_reads_and_refuses_writes(tmp_path):
    rw = LocalStore(tmp_path / "store")
    publish(rw, KEY_A, FILES)
    rw.path(layout.manifest_path(KEY_B)).parent.mkdir(parents=True)
    rw.path(layout.manifest_path(KEY_B)).write_text("{garbage")
    ro = LocalStore(tmp_path / "store", read_only=True)
    assert ro.lookup(KEY_A, deep=True).hit and ro.keys() == sorted([KEY_A, KEY_B])
    found = ro.repair(KEY_B)  # reported, not moved
    assert found.damage.startswith("manifest is not valid JSON") and ro.path(layout.manifest_path(KEY_B)).exists()
    with pytest.raises(ReadOnlyStore):
        ro.put_object("leases/x.json", b"{}")
    with pytest.raises(ReadOnlyStore):
        ro.quarantine(KEY_B, "no")
    with pytest.raises(ReadOnlyStore):
        ro.new_staging(KEY_A)
    assert ro.clean_staging() == 0
    view = ro.artifact_dir(KEY_A)  # the view under views/ was built by the writable store already
    assert (view / "model.pt").read_bytes() == FILES["model.pt"]
    assert not (tmp_path / "store" / "quarantine").exists()


def test_open_store_notices_a_folder_it_may_not_write(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    assert open_store(tmp_path / "store").read_only is False
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert open_store(tmp_path / "store").read_only is True
    assert open_store(tmp_path / "store", read_only=False).read_only is False


def test_a_store_of_the_old_layout_is_refused_with_one_line(tmp_path):
    (tmp_path / "store" / "objects" / "ab").mkdir(parents=True)
    with pytest.raises(UserError) as ei:
        LocalStore(tmp_path / "store")
    assert str(ei.value).startswith(f"store at {tmp_path / 'store'} has the old layout (objects/); rebuild it or "
                                    f"move it aside")
    assert "\n" not in str(ei.value)


def test_the_no_op_check_trusts_its_index_only_while_every_signature_holds(tmp_path, monkeypatch):
    s = LocalStore(tmp_path / "store")
    publish(s, KEY_A, FILES)
    fresh = LocalStore(s.root)  # a new process: the index is read from the store
    calls = []
    real = fresh.lookup
    monkeypatch.setattr(fresh, "lookup", lambda key, deep=False: calls.append(key) or real(key, deep))
    assert fresh.is_cached(KEY_A) and calls == []  # answered from the index: no manifest parsed
    assert not fresh.is_cached(KEY_B) and calls == [KEY_B]  # not indexed: the full lookup decides

    # a blob rewritten in place with the same size: its mtime differs, so the index no longer vouches
    blob = s.path(layout.blob_path(entry(FILES["model.pt"])["sha256"]))
    os.chmod(blob, 0o644)
    blob.write_bytes(b"X" * len(FILES["model.pt"]))
    calls.clear()
    assert fresh.is_cached(KEY_A) and calls == [KEY_A]  # the full (size) lookup, as before the index
    # the manifest gone: a miss, whatever the index says
    s.path(layout.manifest_path(KEY_A)).unlink()
    assert not fresh.is_cached(KEY_A)


def test_a_result_speaks_only_for_the_artifact_it_judged(tmp_path):
    """A stale artifact rebuilt under its key (a recorded read changed: new weights, relinked) kept the old
    artifact's validation: the ``validated`` gate passed weights nobody validated. A result names the manifest
    it judged; under another manifest it is no result."""
    from tests.helpers.store import manifest

    store = LocalStore(tmp_path / "s")
    publish(store, KEY_A, {"model.pt": b"old weights"})
    store.put_result(KEY_A, "validation", "cpu", {"verdict": "pass"})
    assert store.result(KEY_A, "validation", "cpu")["verdict"] == "pass"
    assert list(store.results(KEY_A, "validation")) == ["cpu"]
    folder = store.new_staging(KEY_A) / "object"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"new weights")
    store.seal(folder, manifest(KEY_A, {"model.pt": b"new weights"}))
    store.publish(folder, KEY_A, replace=True)
    assert store.result(KEY_A, "validation", "cpu") is None and store.results(KEY_A, "validation") == {}
    store.put_result(KEY_A, "validation", "cpu", {"verdict": "pass"})
    assert store.result(KEY_A, "validation", "cpu")["verdict"] == "pass"
