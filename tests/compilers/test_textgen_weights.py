"""The two parts of a text-generation graph's key (issue 38, item 2) on a tiny Llama (transformers' code,
random weights): the structure holds the graph, the weights by name, dtype and shape, the KV state, the
model's config and the facts ``textgen.json`` records; a fine-tune (new values) keeps it, a changed
vocabulary, hidden size, config value or generation setting changes it. And the trap: a package that
inlined a weight into its kernels cannot take new weights, so it is never recorded as external."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from neuron_build.compilers import graph_key, textgen, weights
from tests.helpers import textgen as textgen_kit


def _request(graph: str = "decode", tmp=None, external: bool = True) -> SimpleNamespace:
    return SimpleNamespace(options={"graph": graph, "batch": 1, "seq": 8, "max_seq_len": 32}, factory=None,
                           kwargs={}, hf=None, hardware_target="cpu", inline_weights_to_neff=not external,
                           out_dir=str(tmp) if tmp else "", work_dir=str(tmp) if tmp else "")


def _lm(seed: int = 0, generation: dict | None = None, **changes):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    lm = textgen.causal_lm(LlamaForCausalLM(textgen_kit.llama_config(**changes)).eval())
    for k, v in (generation or {}).items():
        setattr(lm.generation_config, k, v)
    return lm


def _parts(lm, graph: str = "decode") -> tuple[dict, dict]:
    req = _request(graph)
    w = textgen.static_wrapper(lm, 1, 32)
    ep = textgen.export_graph(w, graph, 1, 8)
    state = weights.exported_state(ep)
    return (textgen.structure_document(ep, w, req, lm, state),
            weights.weights_document({k: v for k, v in state.items() if not k.startswith(textgen.STATE_PREFIXES)}))


@pytest.fixture(scope="module")
def base() -> tuple[dict, dict]:
    return _parts(_lm(0))


def test_a_fine_tune_keeps_the_structure_and_changes_the_weights_part(base):
    s0, w0 = base
    s7, w7 = _parts(_lm(7))
    assert graph_key.document_digest(s0) == graph_key.document_digest(s7)
    assert set(w0) == set(w7) and all(w0[k] != w7[k] for k in w0 if "norm" not in k and "inv_freq" not in k)
    assert w0["model.model.rotary_emb.inv_freq"] == w7["model.model.rotary_emb.inv_freq"]  # (from the config)
    assert "model.lm_head.weight" in w0 and not any(k.startswith(textgen.STATE_PREFIXES) for k in w0)
    names = [w[0] for w in s0["weights"]]
    assert ["model.model.embed_tokens.weight", "float32", [1000, 64]] in s0["weights"]
    assert "key_cache_0" in names  # the KV state is bound by name, dtype and shape too
    assert s0["textgen"]["generation"] == {"pad_token_id": 0, "eos_token_id": 2}


@pytest.mark.parametrize("change", [
    {"vocab_size": 1200},                                   # a weight's shape
    {"hidden_size": 96, "intermediate_size": 192},          # every shape
    {"rope_theta": 500.0},                                  # a config value (only inv_freq's values move)
    {"rms_norm_eps": 1e-5},                                 # a literal in the graph
    {"generation": {"eos_token_id": 5}},                    # what textgen.json records for serving
])
def test_a_changed_config_or_generation_setting_changes_the_structure(change, base):
    change = dict(change)
    gen = change.pop("generation", None)
    other, _ = _parts(_lm(0, generation=gen, **change))
    assert graph_key.document_digest(base[0]) != graph_key.document_digest(other)


def test_the_inline_key_holds_the_generation_settings_too():
    """Named defect: the inline (by value) key held no generation settings, so a changed eos in
    generation_config.json reused the stored textgen.json (the old eos and pad) for the new key."""
    def doc(lm):
        w = textgen.static_wrapper(lm, 1, 32)
        return textgen.graph_document(textgen.export_graph(w, "decode", 1, 8), w, _request(external=False), lm)
    assert graph_key.document_digest(doc(_lm(0))) != graph_key.document_digest(
        doc(_lm(0, generation={"eos_token_id": 5})))


@pytest.mark.slow
def test_a_package_that_inlined_a_weight_is_never_recorded_external(tmp_path, monkeypatch):
    """AOTInductor inlines a 1-D tensor of <= 8 elements into its kernels as literals unless
    ``always_keep_tensor_constants`` is set [measured, torch 2.13]: the tiny Llama's ``rotary_emb.inv_freq``
    (8 elements). A relink of such a package would serve the stored literals, not the new weights: the
    compile checks ``get_constant_fqns()`` against every weight and KV tensor and records the package as
    inline, which :func:`neuron_build.build.graph.relink.refused` refuses."""
    from neuron_build.build.graph import relink

    monkeypatch.setattr(textgen, "AOTI_CONFIG_EXTERNAL", {"aot_inductor.package_constants_in_so": False})
    out = tmp_path / "out"
    out.mkdir()
    res = textgen.TextGenInductorCompiler().compile(_lm(0), (), _request("decode", out))
    assert res.details["weights"] == "inline"
    assert "model.model.rotary_emb.inv_freq" in res.details["weights_inline_why"]
    old = SimpleNamespace(compiler=res.details, files={"weights.json": 1, "weights.safetensors": 1})
    assert relink.refused(None, "k", old, out) == "the stored artifact holds its weights inline"


def test_the_staged_weights_go_to_a_folder_not_made_yet(tmp_path, base):
    """Named defect: the graph probe (and ``verify --fresh``) hands the compiler an output folder it never
    makes; staging the weights there failed and the graph was keyed by value, so the fresh gate found every
    external-weights artifact "not what today's code builds" and refused its promotion."""
    lm = _lm(0)
    w = textgen.static_wrapper(lm, 1, 32)
    ep = textgen.export_graph(w, "decode", 1, 8)
    state = textgen._stage_weights(ep, tmp_path / "probe" / "out")
    assert state is not None and weights.problem(tmp_path / "probe" / "out") is None
    assert graph_key.document_digest(textgen.structure_document(ep, w, _request(), lm, state)) == \
        graph_key.document_digest(base[0])
