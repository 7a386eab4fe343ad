"""Text-generation models for real (AOTInductor, CPU): a project of a tiny Llama and a tiny GPT-2
(transformers' code, random weights, hf folders made here with a fixed seed) plans both graphs, builds,
validates, releases, pulls, and generate() on the pulled release equals transformers' greedy generate()
token for token. One module-scoped build (5 AOTInductor compiles) serves every assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow


def cli(cfg: Path, *args: str):
    return run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=textgen_kit.ENV, timeout=1800)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Llama at batch 2, seq 8 and 16 (3 graphs), GPT-2 at batch 1, seq 8 (2 graphs): built, validated,
    both released, promoted to dev and pulled."""
    root = tmp_path_factory.mktemp("textgen")
    cfg = textgen_kit.write_project(root / "proj")
    plan = json.loads(cli(cfg, "plan", "--json").stdout)["targets"]
    r = cli(cfg, "build", "-n", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    val = cli(cfg, "validate", "--json")
    pulled = {}
    for model in ("llama", "gpt2"):
        rel = json.loads(cli(cfg, "release", model, "--json").stdout)
        r = cli(cfg, "promote", model, rel["id"], "--to", "dev", "--json")
        assert r.returncode == 0, r.stdout + r.stderr
        dest = root / f"serve-{model}"
        r = cli(cfg, "pull", model, "--channel", "dev", "--dest", str(dest))
        assert r.returncode == 0, r.stdout + r.stderr
        pulled[model] = (rel, dest)
    return {"cfg": cfg, "plan": plan, "validate": val, "pulled": pulled}


def test_plan_lists_both_graphs_of_every_bucket(built):
    assert [(r["target"], r["graph"], r["state"]) for r in built["plan"]] == [
        ("llama/prefill-b2-s8/fp32/p1", "prefill", "missing"), ("llama/prefill-b2-s16/fp32/p1", "prefill", "missing"),
        ("llama/decode-b2/fp32/p1", "decode", "missing"),
        ("gpt2/prefill-b1-s8/fp32/p1", "prefill", "missing"), ("gpt2/decode-b1/fp32/p1", "decode", "missing")]
    again = json.loads(cli(built["cfg"], "plan", "--json").stdout)["targets"]
    assert {r["state"] for r in again} == {"cached"}


def test_validation_passes_token_for_token(built):
    r = built["validate"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = json.loads(r.stdout)["records"]
    assert len(recs) == 5 and {x["verdict"] for x in recs} == {"pass"}
    for x in recs:
        assert x["outputs"] and all(o["tokens_equal"] and o["first_diff"] is None for o in x["outputs"])


def test_a_release_pins_both_graphs_and_the_weights_once(built):
    rel, dest = built["pulled"]["llama"]
    assert sorted(a["bucket_id"] for a in rel["artifacts"]) == ["decode-b2", "prefill-b2-s16", "prefill-b2-s8"]
    shas = {a["files"]["weights.safetensors"]["sha256"] for a in rel["artifacts"]}
    assert len(shas) == 1  # one weights blob for the three graphs
    cfg = built["cfg"]
    sha = shas.pop()
    assert len(list((cfg.parent / "artifacts").rglob(sha))) == 1
    doc = json.loads((dest / "release.json").read_text())
    assert doc["textgen"]["graphs"] == {"prefill-b2-s8": "prefill", "prefill-b2-s16": "prefill",
                                        "decode-b2": "decode"}
    assert doc["textgen"]["max_seq_len"] == 64
    # the pulled folder holds the weights once too: every bucket lists the one file
    (w,) = [p.relative_to(dest).as_posix() for p in dest.rglob("weights.safetensors")]
    assert [[p for p in b["files"] if p.endswith("weights.safetensors")] for b in doc["buckets"]] == [[w]] * 3
    assert {b["files"][w]["sha256"] for b in doc["buckets"]} == {sha}


def test_generate_on_the_pulled_release_equals_transformers(built):
    import torch

    from neuron_build.runtime import BucketedModel

    root = built["cfg"].parent
    g = torch.Generator().manual_seed(7)
    for model, cases in (("llama", [(2, 5), (2, 12), (1, 8), (3, 16)]), ("gpt2", [(1, 3), (2, 8)])):
        bm = BucketedModel.load(built["pulled"][model][1])
        ref = textgen_kit.eager(root / f"hf-{model}")
        for batch, n in cases:  # a batch of 2, a prompt in the larger bucket, batches padded and split
            prompt = torch.randint(3, 1000, (batch, n), generator=g)
            want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                                min_new_tokens=10, do_sample=False, pad_token_id=0)
            got = bm.generate(prompt, max_new_tokens=10)
            assert got.dtype == torch.long and torch.equal(got, want), (model, batch, n)
    # generate() records each prompt's length against the prefill bucket that took it (gpt2's cases)
    assert {s["sizes"]["seq"]: s["count"] for s in bm.traffic()["shapes"]} == {3: 1, 8: 2}
    assert bm.traffic()["calls"] == 3 and bm.traffic()["unserved"] == 0
    # left padding with an attention mask: each row equals its unpadded generation
    bm = BucketedModel.load(built["pulled"]["llama"][1])
    ref = textgen_kit.eager(root / "hf-llama")
    a, b = torch.randint(3, 1000, (1, 9), generator=g), torch.randint(3, 1000, (1, 4), generator=g)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 5, dtype=torch.long), b], 1)])
    mask = (torch.arange(9) >= torch.tensor([[0], [5]])).long()
    got = bm.generate(ids, attention_mask=mask, max_new_tokens=6)
    for row, p in ((0, a), (1, b)):
        want = ref.generate(p, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(got[row, 9:], want[0, p.shape[1]:])
    # eos: a row stops at eos and is padded with it, as transformers does
    eos = int(want[0, b.shape[1] + 2])
    got = bm.generate(b, max_new_tokens=6, eos_token_id=eos)
    exp = ref.generate(b, max_new_tokens=6, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert torch.equal(got, exp)


def test_a_checkpoint_folder_as_published_generates_what_transformers_generates(built):
    """hf-llama is a checkpoint as published (generation_config.json names only bos/eos: no use_cache, no
    pad_token_id): it built, validated, released and pulled (the fixture). Batch 1 and 2, left padding, and a
    batch of 2 where one row meets eos and the other does not, each against transformers' greedy generate
    of the same folder with its own generation config (which pads a finished row with eos: it names no pad
    token)."""
    import torch

    from neuron_build.runtime import BucketedModel

    folder = built["cfg"].parent / "hf-llama"
    assert json.loads((folder / "generation_config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 2}
    bm = BucketedModel.load(built["pulled"]["llama"][1])
    ref = textgen_kit.eager(folder)
    g = torch.Generator().manual_seed(11)
    for batch in (1, 2):
        prompt = torch.randint(3, 1000, (batch, 7), generator=g)
        want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8,
                            do_sample=False)
        assert torch.equal(bm.generate(prompt, max_new_tokens=8), want), batch
    a, b = torch.randint(3, 1000, (1, 10), generator=g), torch.randint(3, 1000, (1, 6), generator=g)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 4, dtype=torch.long), b], 1)])  # left padding
    mask = (torch.arange(10) >= torch.tensor([[0], [4]])).long()
    free = ref.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    eos = int(free[1, 12])  # row 1's third new token: row 1 meets eos there
    assert eos not in free[0, 10:].tolist()  # row 0 never does
    want = ref.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=eos)
    got = bm.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=eos)
    assert want.shape == (2, 18) and torch.equal(got, want)


def test_too_long_prompt_is_one_line_with_the_fix(built):
    import torch

    from neuron_build.compilers.textgen_serve import GenerateError
    from neuron_build.runtime import BucketedModel

    bm = BucketedModel.load(built["pulled"]["llama"][1])
    with pytest.raises(GenerateError) as e:
        bm.generate(torch.ones(1, 17, dtype=torch.long), max_new_tokens=2)
    assert str(e.value) == (
        "a prompt of 17 tokens is longer than every prefill bucket of llama (seq = [8, 16]); add a seq bucket >= 17 "
        "(below max_seq_len = 64) to [models.llama] buckets in buckets.toml, then build, release, promote and pull "
        "again")
    with pytest.raises(GenerateError, match="exceeds the KV cache of llama"):
        bm.generate(torch.ones(1, 16, dtype=torch.long), max_new_tokens=60)
    with pytest.raises(Exception, match="is a text-generation release: call generate"):
        bm(torch.ones(2, 8, dtype=torch.long))


def test_compile_cache_release_warms_up_with_zero_compiles(tmp_path):
    """A compile-cache release of a text-generation model (batch 1, seq 8: 2 graphs): the promotion's warm-up
    gate and `warmup --json` in a fresh process hit the caches for both graphs and compile nothing."""
    cfg = textgen_kit.write_project(tmp_path / "proj", backend="compile-cache",
                                    llama_buckets="{ batch = [1], seq = [8] }", gpt2=False)
    r = cli(cfg, "build", "-n", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads(cli(cfg, "show", "llama/decode-b1/fp32/p1", "--json").stdout)
    assert m["compiler"]["artifact"] == "compile_cache.bin" and m["compiler"]["textgen"]["graph"] == "decode"
    rel = json.loads(cli(cfg, "release", "llama", "--json").stdout)
    r = cli(cfg, "promote", "llama", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "warm-up only",
            "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    gate = next(g for g in json.loads(r.stdout)["gates"] if g["name"] == "warmup")
    assert gate["passed"] is True and gate["figures"]["buckets"]["prefill-b1-s8"]["compiles"] == 0
    dest = tmp_path / "serve"
    assert cli(cfg, "pull", "llama", "--channel", "dev", "--dest", str(dest)).returncode == 0
    r = run_cli("warmup", str(dest), "--json", "--factory-root", str(cfg.parent), cwd=tmp_path, env=textgen_kit.ENV)
    assert r.returncode == 0, r.stdout + r.stderr
    w = json.loads(r.stdout)
    assert w["zero_compiles"] is True and w["compiles_total"] == 0
    (b,) = w["buckets"]
    assert b["id"] == "prefill-b1-s8" and b["cache_hits"] == 2  # the prefill and the decode graph
    assert w["installed"]["inductor"] >= 2


FACTORY = '''\
"""A tiny Llama built by a factory (random weights, seed 0)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()
'''


def test_a_comment_in_a_decoders_factory_compiles_no_graph(tmp_path):
    """Issue 31, item 6: the text-generation compiler asks for a graph key for its prefill and decode graphs,
    so a comment edit of the decoder's factory reuses both (0 compiles, 2 graph reuses), and ``generate`` on
    the release of the reused artifacts equals transformers' greedy generate token for token."""
    import importlib.util

    import torch

    root = tmp_path / "proj"
    (root / "lmlib").mkdir(parents=True)
    (root / "lmlib" / "__init__.py").write_text("")
    src = root / "lmlib" / "lm.py"
    src.write_text(FACTORY)
    cfg = root / "buckets.toml"
    cfg.write_text('[build]\nbackend = "inductor"\ndevice = "cpu"\ntimeout_s = 1800\n\n[profiles.p1]\n'
                   'compiler_args = []\n\n[models.lm]\ntask = "text-generation"\nfactory = "lmlib.lm:build"\n'
                   'dtypes = ["fp32"]\nprofiles = ["p1"]\nmax_seq_len = 32\nbuckets = { batch = [1], seq = [8] }\n')

    def build() -> dict:
        before = json.loads(cli(cfg, "report", "--json").stdout)
        r = cli(cfg, "build", "-n", "1")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        after = json.loads(cli(cfg, "report", "--json").stdout)
        return {k: after[k] - before[k] for k in ("compiles", "graph_reused")}

    assert build() == {"compiles": 2, "graph_reused": 0}
    src.write_text("# a comment: the graphs are the same\n" + FACTORY.replace("(random weights", "(weights random"))
    assert build() == {"compiles": 0, "graph_reused": 2}
    plan = json.loads(cli(cfg, "plan", "--json").stdout)["targets"]
    assert {r["state"] for r in plan} == {"cached"} and len(plan) == 2
    for r in plan:
        man = json.loads(cli(cfg, "show", r["target"], "--json").stdout)
        man = man.get("manifest", man)
        assert man["reused_from"] and man["reused_from"] != man["key"] and len(man["graph_key"]) == 64
    rel = json.loads(cli(cfg, "release", "lm", "--json").stdout)
    r = cli(cfg, "promote", "lm", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "generate checked here")
    assert r.returncode == 0, r.stdout + r.stderr
    dest = tmp_path / "serve"
    assert cli(cfg, "pull", "lm", "--channel", "dev", "--dest", str(dest)).returncode == 0

    from neuron_build.runtime import BucketedModel

    spec = importlib.util.spec_from_file_location("lm_factory_ref", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref = mod.build()
    bm = BucketedModel.load(dest)
    prompt = torch.randint(3, 1000, (1, 6), generator=torch.Generator().manual_seed(3))
    want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8,
                        do_sample=False, pad_token_id=0)
    assert torch.equal(bm.generate(prompt, max_new_tokens=8), want)
