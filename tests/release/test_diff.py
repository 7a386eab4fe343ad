"""``releases diff`` of two releases pinning one key with other files: a stale artifact rebuilt under its key
(new weights a factory read from a recorded file, relinked) is a changed bucket, never "key same ... 0 changed"."""

from __future__ import annotations

from types import SimpleNamespace

from neuron_build.release.diff import diff_releases, format_diff
from neuron_build.store.local import LocalStore

KEY = "ab" * 32


def _release(rid: str, weights_sha: str) -> SimpleNamespace:
    files = {"model.pt2": {"sha256": "1" * 64, "size": 10}, "weights.safetensors": {"sha256": weights_sha, "size": 4}}
    art = SimpleNamespace(bucket_id="b1", target="tiny/b1/fp32/o2", key=KEY, files=files)
    return SimpleNamespace(id=rid, model="tiny", dtype="fp32", profile="o2", backend="inductor",
                           hardware_target="cpu", created="2026-12-05T00:00:00+00:00", creator="t", git_commit=None,
                           toolchain={"torch": "2.13.0"}, metrics={}, artifacts=[art])


def test_one_key_with_other_weights_is_a_changed_bucket(tmp_path):
    store = LocalStore(tmp_path / "store")
    doc = diff_releases(store, _release("r-1", "2" * 64), _release("r-2", "3" * 64), channels=[])
    (b,) = doc["buckets"]
    assert (b["state"], b["key"]["same"], b["key"]["files"]) == ("changed", True, ["weights.safetensors"])
    assert doc["changed"] == ["b1"] and doc["same"] == []
    text = format_diff(doc)
    assert "~ b1: key same (abababababab), files changed: weights.safetensors" in text.splitlines(), text
    assert text.splitlines()[-1] == "1 changed, 0 same, 0 added, 0 removed"
    same = diff_releases(store, _release("r-1", "2" * 64), _release("r-2", "2" * 64), channels=[])
    assert same["same"] == ["b1"] and same["buckets"][0]["key"]["files"] == []
