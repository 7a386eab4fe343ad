"""The one text-generation loading seam (:mod:`neuron_build.compilers.textgen_load`): what a source resolves
to, and the one line every caller gives for a backend without a text-generation serving engine."""

from __future__ import annotations

import json

import pytest

from neuron_build.compilers.textgen_load import (
    NoTextGenEngine,
    TextGenGraph,
    TextGenSource,
    load_next_token,
    load_textgen,
)
from neuron_build.errors import UserError
from neuron_build.runtime import BucketedModel, PulledRelease, textgen_source


def textgen_release(backend: str) -> dict:
    """A pulled text-generation release.json of two graphs of batch 1 (prefill seq 8, decode); the weights are
    listed by both buckets but pulled once, under the prefill bucket's folder."""
    w = {"size": 3, "sha256": "a" * 64}
    buckets = [{"id": "b1-s8", "target": "lm/b1-s8/fp32/p1", "key": "0" * 64, "sizes": {"batch": 1, "seq": 8}, "artifact": "b1-s8/model.pt2",
                "loader": "torch._inductor.aoti_load_package", "inputs": [{"name": "input_ids", "shape": [1, 8],
                                                                           "dtype": "int64"}],
                "files": {"b1-s8/weights.safetensors": w}},
               {"id": "b1-d", "target": "lm/b1-d/fp32/p1", "key": "1" * 64, "sizes": {"batch": 1, "seq": 1}, "artifact": "b1-d/model.pt2",
                "loader": "torch._inductor.aoti_load_package", "inputs": [{"name": "input_ids", "shape": [1, 1],
                                                                           "dtype": "int64"}],
                "files": {"b1-s8/weights.safetensors": w}}]
    return {"release": "r1", "model": "lm", "backend": backend, "dims": ["batch", "seq"],
            "inputs": [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64"}], "buckets": buckets,
            "textgen": {"graphs": {"b1-s8": "prefill", "b1-d": "decode"}, "max_seq_len": 16}}


def test_a_pulled_release_resolves_each_file_to_its_pulled_copy(tmp_path):
    src = textgen_source(PulledRelease.from_json(textgen_release("inductor"), "release.json"), tmp_path)
    assert (src.model, src.backend, src.max_seq_len, src.where) == ("lm", "inductor", 16,
                                                                     str(tmp_path / "release.json"))
    prefill, decode = src.graphs
    assert (prefill.folder, prefill.artifact) == (tmp_path / "b1-s8", tmp_path / "b1-s8/model.pt2")
    # the decode graph's weights are the prefill bucket's copy, read once per sha256
    assert decode.file("weights.safetensors") == (tmp_path / "b1-s8/weights.safetensors", "a" * 64)
    # a file nobody lists is the folder's own, its path its id
    assert decode.file("textgen.json") == (tmp_path / "b1-d/textgen.json", str(tmp_path / "b1-d/textgen.json"))


def test_an_unreadable_textgen_json_is_one_line_naming_it(tmp_path):
    with pytest.raises(UserError) as e:
        TextGenGraph(tmp_path).info()
    assert str(e.value).startswith(f"{tmp_path / 'textgen.json'}: cannot read it (")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("backend", ["torchscript", "torchneuron", ""])
def test_a_backend_without_an_engine_is_the_same_line_for_every_caller(tmp_path, backend):
    """Serving (BucketedModel.load), validation (load_textgen) and bench (load_next_token) all say it so."""
    src = TextGenSource("lm", backend, (TextGenGraph(tmp_path),), "lm-b1-s8 (key 0123)")
    want = (f"backend {backend!r} has no text-generation serving engine (text generation is served from inductor, "
            f"compile-cache and neuron (NxDI) builds); set backend to one of them for the model in buckets.toml "
            f"and build again")
    for load in (load_textgen, load_next_token):
        with pytest.raises(NoTextGenEngine) as e:
            load(src)
        assert str(e.value) == f"lm-b1-s8 (key 0123): {want}"
    rel = textgen_release(backend)
    for b in rel["buckets"]:
        b.update(loader="torch.jit.load", artifact=f"{b['id']}/model.pt", files={})
        (tmp_path / b["id"]).mkdir(exist_ok=True)
        (tmp_path / b["id"] / "model.pt").write_bytes(b"")
    (tmp_path / "release.json").write_text(json.dumps(rel))
    with pytest.raises(NoTextGenEngine) as e:
        BucketedModel.load(tmp_path)
    assert str(e.value) == f"{tmp_path / 'release.json'}: {want}"


def test_a_cache_build_without_its_model_is_one_line(tmp_path):
    src = TextGenSource("lm", "compile-cache", (TextGenGraph(tmp_path),), "here")
    with pytest.raises(UserError, match=r"^here: a compile-cache text-generation artifact holds caches; it is loaded "
                                        r"with the model it was built from and its serving record$"):
        load_textgen(src)
