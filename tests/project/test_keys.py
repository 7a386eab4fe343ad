"""Keys: stable across paths and machines; each change rebuilds exactly the affected targets."""

from __future__ import annotations

import shutil
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.project.keys import COMPONENTS, DigestCache, KeyMaker, diff_components
from neuron_build.project.matrix import bucket_id, expand
from neuron_build.project.sources import local_imports
from neuron_build.store.records import TargetRecord
from neuron_build.workspace import Workspace
from tests.helpers.projects import edit


def keys_of(cfg: Path, **kw) -> dict[str, str]:
    p = load_project(cfg)
    km = KeyMaker(p, **kw)
    return {t.id: km.key(t).key for t in expand(p)}


def test_target_ids_and_expansion(tiny):
    ids = [t.id for t in expand(load_project(tiny))]
    assert ids == ["tiny/b1/fp32/p1", "tiny/b4/fp32/p1", "tiny/b1/fp32/p2", "tiny/b4/fp32/p2",
                   "tiny/b1/bf16/p1", "tiny/b4/bf16/p1", "tiny/b1/bf16/p2", "tiny/b4/bf16/p2",
                   "other/static/fp32/p1"]
    assert bucket_id([("batch", 8), ("seq", 512)]) == "b8-s512"
    assert bucket_id([("seq", 8), ("size", 2)]) == "seq8-size2"


def test_keys_are_hex_and_distinct(tiny):
    k = keys_of(tiny)
    assert len(set(k.values())) == len(k) == 9
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in k.values())


def test_moved_checkout_same_keys(tiny, tmp_path):
    before = keys_of(tiny)
    moved = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(tiny.parent, moved)
    assert keys_of(moved / "buckets.toml") == before


def test_bucket_change_touches_only_that_bucket(tiny):
    before = keys_of(tiny)
    edit(tiny, "buckets = { batch = [1, 4] }", "buckets = { batch = [1, 5] }")
    after = keys_of(tiny)
    assert {i for i in after if i not in before} == {"tiny/b5/fp32/p1", "tiny/b5/fp32/p2", "tiny/b5/bf16/p1",
                                                     "tiny/b5/bf16/p2"}
    assert all(after[i] == before[i] for i in after if i in before)


def test_compiler_args_change_touches_only_that_profile(tiny):
    before = keys_of(tiny)
    edit(tiny, 'compiler_args = ["-O2", "--model-type", "transformer"]', 'compiler_args = ["-O3", "--model-type", "transformer"]')
    after = keys_of(tiny)
    assert {i for i in after if after[i] != before[i]} == {i for i in after if i.endswith("/p2")}
    assert len([i for i in after if after[i] != before[i]]) == 4


def test_spelling_of_args_does_not_change_key(tiny):
    before = keys_of(tiny)
    edit(tiny, 'compiler_args = ["-O2", "--model-type", "transformer"]',
         'compiler_args = ["--model-type=transformer", "--optlevel", "2", "--verbose=info"]')
    assert keys_of(tiny) == before


def test_model_source_change_touches_only_that_model(tiny):
    before = keys_of(tiny)
    f = tiny.parent / "tinylib" / "tiny.py"
    f.write_text(f.read_text() + "\n# a comment is a source change\n")
    after = keys_of(tiny)
    assert {i for i in after if after[i] != before[i]} == {i for i in after if i.startswith("tiny/")}


def test_imported_module_is_part_of_the_key(tiny):
    before = keys_of(tiny)
    (tiny.parent / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 3\n")
    after = keys_of(tiny)
    changed = {i for i in after if after[i] != before[i]}
    assert changed == {i for i in after if i.startswith("tiny/")}
    files = [p.name for p in local_imports(tiny.parent / "tinylib" / "tiny.py", tiny.parent)]
    assert files == ["__init__.py", "act.py", "tiny.py"]  # importing tinylib.act runs tinylib/__init__.py


def test_env_and_backend_in_key(tiny, monkeypatch):
    base = keys_of(tiny)
    monkeypatch.setenv("PYTORCH_JIT", "0")
    assert keys_of(tiny) != base  # torchscript backend: PYTORCH_JIT=0 turns scripting off
    monkeypatch.delenv("PYTORCH_JIT")
    monkeypatch.setenv("NEURON_CC_FLAGS", "--optlevel=3")  # not a torchscript variable
    assert keys_of(tiny) == base
    assert keys_of(tiny, backend="inductor") != base


def test_diff_names_component_and_subkey(tiny):
    p = load_project(tiny)
    km = KeyMaker(p)
    t = expand(p)[0]
    old = km.details(t)
    (tiny.parent / "tinylib" / "act.py").write_text("def scale(x):\n    return x\n")
    new = KeyMaker(load_project(tiny)).details(t)
    assert diff_components(old, new) == ["model: sources.tinylib/act.py"]
    assert list(COMPONENTS) == ["format", "model", "inputs", "compiler", "env", "toolchain"]


def test_weight_digest_cached_by_stat(tmp_path, monkeypatch):
    import neuron_build.project.digest_cache as keys
    w = tmp_path / "w.bin"
    w.write_bytes(b"x" * 1000)
    calls = []
    real = keys.file_sha256
    monkeypatch.setattr(keys, "file_sha256", lambda p, *a: calls.append(p) or real(p, *a))
    c = DigestCache(tmp_path / "cache.json")
    d1 = c.digest(w)
    c.save()
    c2 = DigestCache(tmp_path / "cache.json")
    assert c2.digest(w) == d1
    assert len(calls) == 1  # the second lookup only stat()ed the file
    w.write_bytes(b"y" * 1000)
    assert c2.digest(w) != d1
    assert len(calls) == 2


def test_declared_weights_and_packages_in_key(tiny):
    (tiny.parent / "w.bin").write_bytes(b"weights-v1")
    edit(tiny, 'factory = "tinylib.other:build"', 'factory = "tinylib.other:build"\nweights = ["w.bin"]\npackages = ["pydantic"]')
    p = load_project(tiny)
    d = KeyMaker(p).details(expand(p)[-1])
    assert list(d["model"]["weights"]) == ["w.bin"]
    assert d["model"]["packages"]["pydantic"]["version"]
    before = keys_of(tiny)
    (tiny.parent / "w.bin").write_bytes(b"weights-v2")
    after = keys_of(tiny)
    assert {i for i in after if after[i] != before[i]} == {"other/static/fp32/p1"}


def test_plan_changed_names_component_first(tiny):
    b = Builder(Workspace(load_project(tiny)))
    t = b.ws.by_id["tiny/b1/fp32/p1"]
    ki = b.ws.key(t)
    b.ws.store.put_target(TargetRecord(target=t.id, key=ki.key, status="PASS", details=ki.details, hashes=ki.hashes))
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=3"]')
    b2 = Builder(Workspace(load_project(tiny)))
    assert b2.ws.changed(b2.ws.by_id[t.id]) == (["compiler: compiler_args"], t.id)


def test_removed_target_index_picks_the_closest_record():
    """The plan's index of removed targets answers as a scan over all of them would: the record with the
    fewest differing components, the first by target id among equals."""
    import random

    from neuron_build.workspace import _RemovedIndex

    rng = random.Random(7)
    comps = list(COMPONENTS)
    recs = []
    for i in range(300):
        details = {c: rng.choice(["a", "b", "c"]) for c in comps}
        recs.append(TargetRecord(target=f"m/b{i:03d}/fp32/p1", key=str(i), status="PASS", details=details))
    idx = _RemovedIndex()
    for r in reversed(recs):
        idx.add(r)
    for _ in range(50):
        new = {c: rng.choice(["a", "b", "c", "d"]) for c in comps}
        from neuron_build.util import canonical_json, sha256_hex
        hashes = {c: sha256_hex(canonical_json(new[c])) for c in comps}
        want = min(recs, key=lambda r: (len(diff_components(r.details, new)), r.target))
        assert idx.closest(hashes).target == want.target


def test_the_weights_choice_is_in_the_compiler_component_of_that_profile_only(tiny):
    edit(tiny, 'backend = "torchscript"', 'backend = "inductor"')  # (torchscript cannot keep weights apart)
    before = keys_of(tiny)
    edit(tiny, 'compiler_args = ["--optlevel=1"]', 'compiler_args = ["--optlevel=1"]\nweights = "external"')
    after = keys_of(tiny)
    changed = {i for i in after if after[i] != before[i]}
    assert changed and changed == {i for i in after if i.endswith("/p1")}
    p = load_project(tiny)
    t = next(t for t in expand(p) if t.id.endswith("/p1"))
    comp = KeyMaker(p).details(t)["compiler"]
    assert (comp["weights"], comp["inline_weights_to_neff"]) == ("external", False)
