"""The pulled-release record (:mod:`neuron_build.runtime.pulled`): the one module that spells ``release.json``,
and what its reader refuses (one line naming the file and the fix)."""

from __future__ import annotations

import ast
import json

import pytest

from neuron_build.errors import UserError
from neuron_build.runtime.pulled import PulledBucket, PulledRelease, read_pulled, release_file, write_pulled
from tests.helpers.cli import REPO
from tests.helpers.runtime import fake_release

OWNER = REPO / "neuron_build" / "runtime" / "pulled.py"


def _literals(path):
    """The string constants of a module that are code, not docstrings (a bare string statement)."""
    tree = ast.parse(path.read_bytes())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_only_the_record_module_spells_release_json():
    found = [f"{p.relative_to(REPO)}:{n.lineno}" for p in sorted((REPO / "neuron_build").rglob("*.py"))
             if p != OWNER for n in _literals(p) if "release.json" in n.value]
    assert found == []
    assert any(n.value == "release.json" for n in _literals(OWNER))


def test_read_refuses_a_missing_or_mistyped_field_in_one_line(tmp_path):
    doc = fake_release()
    write_pulled(tmp_path, PulledRelease.from_json(doc, "x"))
    rec = read_pulled(tmp_path, "fix")
    assert (rec.release, rec.model, rec.backend, rec.dims, rec.channel, rec.toolchain) == (
        "r-fake", "enc", "torchscript", ["batch", "seq"], None, {})
    assert rec.to_json() == json.loads(release_file(tmp_path).read_text())
    where = str(release_file(tmp_path))
    for change, want in [({"model": None}, f"{where}: no 'model'; not a pulled release: pull the release again"),
                         ({"truncate": "yes"}, f"{where}: 'truncate' is str, not bool; pull the release again"),
                         ({"channel_version": True}, f"{where}: 'channel_version' is bool, not int; pull the "
                                                     f"release again"),
                         ({"format": 2}, f"{where}: format 2, this neuron-build reads format 1; pull the release "
                                         f"again with this neuron-build")]:
        release_file(tmp_path).write_text(json.dumps({**doc, **change}))
        with pytest.raises(UserError) as e:
            read_pulled(tmp_path, "fix")
        assert str(e.value) == want
    release_file(tmp_path).write_text("{")
    with pytest.raises(UserError, match=rf"^{where}: cannot read it \(.*\); pull it again$"):
        read_pulled(tmp_path, "pull it again")


def test_each_bucket_is_a_typed_record_and_a_mistyped_one_refused_in_one_line(tmp_path):
    """The buckets are :class:`PulledBucket` records (attributes, not dict keys), written back as they were
    read; a bucket field missing or of another type, a size that is no int or a file entry without its sha256
    and size is one line naming the file, the bucket's place and the fix."""
    doc = fake_release()
    write_pulled(tmp_path, PulledRelease.from_json(doc, "x"))
    rec = read_pulled(tmp_path, "fix")
    first = rec.buckets[0]
    assert isinstance(first, PulledBucket)
    assert (first.id, first.sizes, first.artifact, first.loader, first.files, first.target, first.key) == (
        "b4-s16", {"batch": 4, "seq": 16}, "b4-s16/model.pt", "torch.jit.load", {}, "enc/b4-s16/fp32/p1", "0416" * 16)
    assert [b.id for b in rec.buckets] == [b["id"] for b in doc["buckets"]]
    assert PulledRelease.from_json(rec.to_json(), "again") == rec
    where = f"{release_file(tmp_path)} buckets[1]"
    for change, want in [({"loader": None}, f"{where}: no 'loader'; not a pulled release: pull the release again"),
                         ({"sizes": [4, 8]}, f"{where}: 'sizes' is list, not dict; pull the release again"),
                         ({"sizes": {"batch": "4"}}, f"{where}: bucket 'b4-s8': 'batch' is not a size, file entry "
                                                     f"(sha256, size) or input spec; pull the release again"),
                         ({"files": {"b4-s8/model.pt": {"sha256": "a" * 64, "size": "3"}}},
                          f"{where}: bucket 'b4-s8': 'b4-s8/model.pt' is not a size, file entry (sha256, size) or "
                          f"input spec; pull the release again")]:
        bad = json.loads(json.dumps(doc))
        bad["buckets"][1].update(change)
        release_file(tmp_path).write_text(json.dumps(bad))
        with pytest.raises(UserError) as e:
            read_pulled(tmp_path, "fix")
        assert str(e.value) == want


def test_an_edited_record_is_refused_when_read_not_at_the_first_call(tmp_path):
    """A trial edited a pulled release.json: an input dtype ``fp99`` loaded and failed with a KeyError at the first
    call; ``buckets = []`` loaded and failed with ``max() arg is an empty sequence`` (``warmup`` exited 0); an
    unknown ``loader`` was taken silently. Each is one line naming the file, the field and the fix."""
    from neuron_build.loaders import LOADERS, TORCH_DTYPES

    doc = fake_release()
    top, b1 = str(release_file(tmp_path)), f"{release_file(tmp_path)} buckets[1]"
    dtypes, loaders = ", ".join(TORCH_DTYPES), ", ".join(sorted(LOADERS))

    def edit(bad):
        bad["inputs"][2]["dtype"] = "fp99"

    def edit_bucket(bad):
        bad["buckets"][1]["inputs"][0]["dtype"] = "fp99"

    def no_buckets(bad):
        bad["buckets"] = []

    def loader(bad):
        bad["buckets"][1]["loader"] = "pickle.load"

    for change, want in [
            (edit, f"{top} inputs[2]: 'dtype' 'fp99' of input 'feats' is not a dtype ({dtypes}); pull the release "
                   "again"),
            (edit_bucket, f"{b1} inputs[0]: 'dtype' 'fp99' of input 'ids' is not a dtype ({dtypes}); pull the "
                          "release again"),
            (no_buckets, f"{top}: 'buckets' is empty: a release has at least one bucket; pull the release again"),
            (loader, f"{b1}: bucket 'b4-s8': 'loader' 'pickle.load' is not a loader this neuron-build knows "
                     f"({loaders}); pull the release again")]:
        bad = json.loads(json.dumps(doc))
        change(bad)
        release_file(tmp_path).write_text(json.dumps(bad))
        with pytest.raises(UserError) as e:
            read_pulled(tmp_path, "fix")
        assert str(e.value) == want


def test_every_loader_a_compiler_records_is_a_known_one():
    """The compilers record their loader from :mod:`neuron_build.loaders`, so the reader's table knows each."""
    from neuron_build.compilers import compile_cache
    from neuron_build.compilers.neuron import external_weights, nxdi
    from neuron_build.loaders import LOADERS

    assert {compile_cache.LOADER, nxdi.LOADER, external_weights.LOADER} <= LOADERS
    assert "torch.jit.load" in LOADERS and "torch._inductor.aoti_load_package" in LOADERS
