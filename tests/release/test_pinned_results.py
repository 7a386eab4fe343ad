"""An older release of a key rebuilt since (new weights from a recorded read, relinked under the same key) pins
files nobody validated: the store's results under that key judged the new artifact, not the release's."""

from __future__ import annotations

from neuron_build.release.diff import bucket_figures
from neuron_build.release.gates import latency_gate, pinned_unjudged, validation_gate
from neuron_build.release.records import Release, ReleaseArtifact, results_speak_for
from neuron_build.store import LocalStore
from tests.helpers.store import KEY_A, KEY_B, entry, manifest, publish

TID = "m/b1/fp32/p"


def _release(files: dict[str, bytes]) -> Release:
    art = ReleaseArtifact(target=TID, key=KEY_A, bucket={"batch": 1}, bucket_id="b1", inputs=[],
                          files={n: entry(b) for n, b in files.items()}, artifact="model.pt", loader="torchscript")
    return Release(id="r-0123456789abcdef", format=1, model="m", dtype="fp32", profile="p", backend="torchscript",
                   hardware_target="cpu", artifacts=(art,), toolchain={}, runtime={},
                   metrics={"artifacts": {TID: {"validation": {"cpu": "fail"}}}})


def _rebuild(store: LocalStore, data: bytes) -> None:
    folder = store.new_staging(KEY_A) / "object"
    folder.mkdir()
    (folder / "model.pt").write_bytes(data)
    store.seal(folder, manifest(KEY_A, {"model.pt": data}))
    store.publish(folder, KEY_A, replace=True)


def _pass(store: LocalStore) -> None:
    store.put_result(KEY_A, "validation", "cpu", {"verdict": "pass", "reason": None, "device_kind": "cpu"})


def test_an_older_release_does_not_pass_the_validated_gate_on_the_rebuilt_artifacts_result(tmp_path):
    store = LocalStore(tmp_path / "s")
    publish(store, KEY_A, {"model.pt": b"old weights"})
    old = _release({"model.pt": b"old weights"})
    _rebuild(store, b"new weights")
    _pass(store)  # validates the new artifact
    new = _release({"model.pt": b"new weights"})
    assert validation_gate(store, new.keys, "cpu", new).passed
    g = validation_gate(store, old.keys, "cpu", old)
    assert not g.passed
    assert g.figures == {"passed": 0, "failed": 0, "not_validated": 1}
    assert g.message == (f"the release's files are not the ones validated: {TID} (the artifact under its key now "
                         "has other files (model.pt)); run `neuron-build validate`, then make a new release "
                         "(`neuron-build release`)")
    assert "\n" not in g.message


def test_unknown_or_unreadable_pins_are_not_a_match(tmp_path):
    store = LocalStore(tmp_path / "s")
    rel = _release({"model.pt": b"w"})
    assert results_speak_for(store, rel.artifacts[0]) == "its artifact is not in the store"
    publish(store, KEY_A, {"model.pt": b"w"})
    assert results_speak_for(store, rel.artifacts[0]) is None
    bad = ReleaseArtifact(**{**rel.artifacts[0].__dict__, "files": {"model.pt": "not a table"}})
    assert results_speak_for(store, bad) == "the artifact under its key now has other files (model.pt)"
    extra = ReleaseArtifact(**{**rel.artifacts[0].__dict__, "files": {**rel.artifacts[0].files, "x.bin": entry(b"")}})
    assert results_speak_for(store, extra) == "the artifact under its key now has other files (x.bin)"


def test_releases_diff_shows_an_older_release_its_own_recorded_figures(tmp_path):
    store = LocalStore(tmp_path / "s")
    publish(store, KEY_A, {"model.pt": b"old weights"})
    old = _release({"model.pt": b"old weights"})
    _rebuild(store, b"new weights")
    _pass(store)
    fig = bucket_figures(store, old, old.artifacts[0])
    assert fig["validation"] == {"cpu": {"verdict": "fail", "error": None}}  # the release's, not the new pass
    assert fig["op_count"] is None and fig["compile_time_s"] is None
    new = _release({"model.pt": b"new weights"})
    assert bucket_figures(store, new, new.artifacts[0])["validation"] == {"cpu": {"verdict": "pass", "error": None}}


def test_the_latency_gate_does_not_compare_an_older_release_by_the_rebuilt_artifacts_benchmarks(tmp_path):
    store = LocalStore(tmp_path / "s")
    publish(store, KEY_A, {"model.pt": b"old weights"})
    old = _release({"model.pt": b"old weights"})
    _rebuild(store, b"new weights")
    new = _release({"model.pt": b"new weights"})
    why = ("the benchmarks under the key of release r-0123456789abcdef are not of its files: the artifact under its "
           "key now has other files (model.pt)")
    assert pinned_unjudged(store, old, None) == {"b1": why}
    assert pinned_unjudged(store, new, None) == {}
    g = latency_gate(store, {"b1": KEY_A}, {"b1": KEY_B}, "cpu", unjudged=pinned_unjudged(store, old))
    assert g.passed and g.figures["not_compared"] == {"b1": why} and g.figures["buckets"] == {}
