"""Text-generation models in buckets.toml (no compile): the config's checks, one line each naming
models.x.<key> and the fix; the prefill and decode targets, their ids, keys and plan rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_build.project.config import load_project
from neuron_build.project.keys import KeyMaker
from neuron_build.project.matrix import expand, select
from tests.helpers.cli import run_cli
from tests.helpers.projects import edit, faults_of

FACTORY = '''
def build():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000))
'''

CONFIG = '''
[build]
backend = "inductor"

[profiles.p1]
compiler_args = []

[models.llama]
task = "text-generation"
factory = "lm:build"
dtypes = ["fp32", "bf16"]
profiles = ["p1"]
max_seq_len = 64
buckets = { batch = [1, 2], seq = [16, 32] }

[models.ffn]
factory = "lm:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 8] }]
buckets = { batch = [1] }
'''


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    (tmp_path / "lm.py").write_text(FACTORY)
    cfg = tmp_path / "buckets.toml"
    cfg.write_text(CONFIG)
    return cfg


def test_targets_are_prefill_per_bucket_and_decode_per_batch(proj):
    p = load_project(proj)
    ts = [t for t in expand(p) if t.model == "llama"]
    assert [t.id for t in ts if t.dtype == "fp32"] == [
        "llama/prefill-b1-s16/fp32/p1", "llama/prefill-b1-s32/fp32/p1", "llama/prefill-b2-s16/fp32/p1",
        "llama/prefill-b2-s32/fp32/p1", "llama/decode-b1/fp32/p1", "llama/decode-b2/fp32/p1"]
    assert len(ts) == 12 and {t.graph for t in ts} == {"prefill", "decode"}
    assert [t.graph_name for t in expand(p) if t.model == "ffn"] == ["forward"]
    assert [t.id for t in select(expand(p), ["llama/decode-*"])] == [
        "llama/decode-b1/fp32/p1", "llama/decode-b2/fp32/p1", "llama/decode-b1/bf16/p1", "llama/decode-b2/bf16/p1"]
    dec = next(t for t in ts if t.id == "llama/decode-b2/fp32/p1")
    assert [(i.name, i.shape, i.dtype) for i in dec.inputs(p.config.models["llama"])] == [
        ("input_ids", (2, 1), "int64"), ("cache_position", (1,), "int64")]


def test_each_graph_has_its_own_key_and_max_seq_len_is_in_it(proj):
    p = load_project(proj)
    km = KeyMaker(p, environ={})
    ts = [t for t in expand(p) if t.model == "llama"]
    keys = {t.id: km.key(t) for t in ts}
    assert len({k.key for k in keys.values()}) == len(ts)
    pre = keys["llama/prefill-b1-s16/fp32/p1"].details["inputs"]
    assert pre == {"dtype": "fp32", "graph": "prefill", "max_seq_len": 64, "inputs": [
        {"name": "input_ids", "shape": [1, 16], "dtype": "int64", "range": [0.0, 2.0]},
        {"name": "cache_position", "shape": [16], "dtype": "int64", "range": [0.0, 64.0]}]}
    edit(proj, "max_seq_len = 64", "max_seq_len = 128")
    km2 = KeyMaker(load_project(proj), environ={})
    for t in ts:
        assert km2.key(t).key != keys[t.id].key
        assert km2.key(t).hashes["model"] == keys[t.id].hashes["model"]


def test_an_nxdi_targets_key_leaves_the_profiles_weights_choice_out(proj):
    """NxDI keeps its weights apart whatever the profile says (its sharded checkpoint): ``weights = "external"``
    would change its key while changing nothing it builds. A forward model of the same profile keeps the
    choice in its key (the XLA path compiles a weight-free NEFF)."""
    edit(proj, 'backend = "inductor"', 'backend = "neuron"')
    before = {t.id: KeyMaker(load_project(proj), environ={}).key(t) for t in expand(load_project(proj))}
    edit(proj, "compiler_args = []", 'compiler_args = []\nweights = "external"')
    p = load_project(proj)
    km = KeyMaker(p, environ={})
    after = {t.id: km.key(t) for t in expand(p)}
    nxdi = [i for i in after if "/nxdi-" in i]
    assert nxdi and all(after[i].key == before[i].key for i in nxdi)
    assert all(after[i].details["compiler"]["inline_weights_to_neff"] is True for i in nxdi)
    assert all("weights" not in after[i].details["compiler"] for i in nxdi)
    (ffn,) = [i for i in after if i.startswith("ffn/")]
    assert after[ffn].key != before[ffn].key and after[ffn].details["compiler"]["weights"] == "external"


def test_plan_json_rows_carry_the_graph(proj):
    r = run_cli("plan", "--json", "-c", str(proj), cwd=proj.parent)
    assert r.returncode == 0, r.stderr
    rows = {row["target"]: row for row in json.loads(r.stdout)["targets"]}
    assert rows["llama/prefill-b2-s32/bf16/p1"]["graph"] == "prefill"
    assert rows["llama/decode-b1/fp32/p1"]["graph"] == "decode"
    assert rows["ffn/b1/fp32/p1"]["graph"] == "forward"
    assert {row["state"] for row in rows.values()} == {"missing"}
    r = run_cli("explain", "llama/decode-b2/fp32/p1", "--json", "-c", str(proj), cwd=proj.parent)
    assert r.returncode == 0, r.stderr
    comps = {c["name"]: c["new"] for c in json.loads(r.stdout)["components"]}
    assert comps["inputs"]["graph"] == "decode" and comps["inputs"]["inputs"][0]["shape"] == [2, 1]


@pytest.mark.parametrize("old,new,fault", [
    ("max_seq_len = 64\n", "",
     'models.llama.max_seq_len: required for task = "text-generation" (the KV cache length in tokens: prompt plus '
     'new tokens); add it, e.g. max_seq_len = 2048'),
    ("seq = [16, 32]", "seq = [16, 64]",
     "models.llama.buckets.seq[1]: a prompt of 64 tokens leaves no room in the KV cache of max_seq_len = 64 for a "
     "new token; lower it below 64 or raise max_seq_len"),
    ("buckets = { batch = [1, 2], seq = [16, 32] }", "buckets = { batch = [1] }",
     "models.llama.buckets: a text-generation model's buckets are the prefill buckets { batch = [...], seq = [...] }; "
     "got { batch }: give exactly batch and seq"),
    ('task = "text-generation"\n', "",
     'models.llama.max_seq_len: applies to task = "text-generation" only; remove it or add task = "text-generation" '
     "to models.llama"),
    ('task = "text-generation"', 'task = "text-gen"',
     "models.llama.task: 'text-gen' is not allowed; allowed: forward, text-generation (did you mean 'text-generation'?)"),
    ("max_seq_len = 64", 'max_seq_len = 64\ninputs = [{ name = "x", shape = [1] }]',
     "models.llama.inputs: a text-generation model's inputs follow from the task (token ids, cache positions, the "
     "KV cache); remove it"),
    ("max_seq_len = 64", "max_seq_len = 64\ndecode_buckets = [32, 64]",
     "models.llama.decode_buckets: the inductor backend decodes against the whole KV cache (max_seq_len); remove it "
     '(token-generation buckets over cache length are NxDI\'s, for backend = "neuron")'),
    ('backend = "inductor"', 'backend = "torchscript"',
     'models.llama.task: text-generation models build with backend inductor or compile-cache (transformers\' '
     'static-cache export) or neuron (NxDI); [build] backend is "torchscript": set backend = "inductor" or '
     '"neuron"'),
])
def test_misuse_is_one_line_naming_the_key(proj, old, new, fault):
    edit(proj, old, new)
    assert faults_of(proj) == [fault]


def test_an_ordinary_model_still_needs_inputs(proj):
    edit(proj, 'inputs = [{ name = "x", shape = ["batch", 8] }]\nbuckets = { batch = [1] }\n', "")
    assert faults_of(proj) == ["models.ffn.inputs: required key is missing; add it"]


def test_hf_textgen_model_takes_causal_lm_only(proj, tmp_path):
    (tmp_path / "hfm").mkdir()
    (tmp_path / "hfm" / "config.json").write_text("{}")
    (tmp_path / "hfm" / "model.safetensors").write_bytes(b"x")
    edit(proj, 'factory = "lm:build"', 'hf = "hfm"\nauto_class = "AutoModel"\noutput = "logits"')
    assert faults_of(proj) == [
        'models.llama.auto_class: a text-generation model loads with AutoModelForCausalLM; remove auto_class or '
        'set it to "AutoModelForCausalLM"',
        "models.llama.output: a text-generation model's graphs return the logits; remove output"]


def test_buckets_suggest_refuses_prompts_longer_than_the_kv_cache(proj, tmp_path, capsys):
    from neuron_build.cli import main
    from neuron_build.traffic import TrafficRecorder

    rec = TrafficRecorder("llama", "r-1", ["batch", "seq"])
    for n in (12, 30, 70):  # 70 > max_seq_len = 64: no prefill bucket can ever hold it
        rec.record({"batch": 1, "seq": n}, None)
    tr = rec.save(tmp_path / "t.jsonl")
    before = proj.read_text()
    assert main(["buckets", "suggest", "llama", "--traffic", str(tr), "--dim", "seq", "--max-buckets", "3",
                 "--write", "-c", str(proj)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tr}: holds prompts of up to 70 tokens, more than max_seq_len = 64 of [models.llama]: "
                   "no prefill bucket can serve them; raise max_seq_len in buckets.toml (and rebuild) or leave "
                   "those requests out of the traffic"]
    assert proj.read_text() == before
