"""Relink instead of compile for text generation (issue 38, item 2): a tiny Llama (transformers' code,
random weights) with ``weights = "external"``, batch 1, seq 8 (a prefill and a decode graph). A fine-tune
(new weight values, same config) compiles no graph: both are relinked (the stored ``model.pt2`` files plus
the new weights), ``validate`` (generate against eager ``generate``) passes on the relinked artifacts, and
the pulled release generates the fine-tuned model's tokens exactly as transformers' ``generate`` of it
does. A changed vocabulary compiles; a weights file that does not fit the graphs is one error line before
anything is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

PREFILL, DECODE = "llama/prefill-b1-s8/fp32/p1", "llama/decode-b1/fp32/p1"


def cli(cfg: Path, *args: str):
    return run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=textgen_kit.ENV, timeout=1800)


def _build(cfg: Path, *targets: str, validate: bool = True) -> dict:
    def counts() -> dict:
        return json.loads(cli(cfg, "report", "--json").stdout)
    before = counts()
    r = cli(cfg, "build", *targets, "-n", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if validate:
        v = cli(cfg, "validate", *targets, "--json")
        assert v.returncode == 0, v.stdout[-3000:] + v.stderr[-3000:]
        recs = json.loads(v.stdout)["records"]
        assert {x["verdict"] for x in recs} == {"pass"} and len(recs) == 2
        assert all(o["tokens_equal"] for x in recs for o in x["outputs"])
    after = counts()
    return {k: after[k] - before[k] for k in ("compiles", "graph_reused", "failed")}


def _manifest(cfg: Path, tid: str) -> dict:
    m = json.loads(cli(cfg, "show", tid, "--json").stdout)
    return m.get("manifest", m)


def _pull(cfg: Path, dest: Path) -> Path:
    rel = json.loads(cli(cfg, "release", "llama", "--json").stdout)
    r = cli(cfg, "promote", "llama", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "checked here",
            "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(cfg, "pull", "llama", "--channel", "dev", "--dest", str(dest))
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def test_a_fine_tune_relinks_both_graphs_and_generates_the_new_models_tokens(tmp_path):
    import torch

    from neuron_build.compilers import weights
    from neuron_build.compilers.textgen_serve import AOTIStates
    from neuron_build.errors import UserError
    from neuron_build.project.config import load_project
    from neuron_build.runtime import BucketedModel
    from neuron_build.workspace import Workspace

    root = tmp_path / "proj"
    cfg = textgen_kit.write_project(root, llama_buckets="{ batch = [1], seq = [8] }", gpt2=False,
                                    profile='weights = "external"')
    hf = root / "hf-llama"
    assert _build(cfg, validate=False) == {"compiles": 2, "graph_reused": 0, "failed": 0}  # (cold: not validated)
    first = {t: _manifest(cfg, t) for t in (PREFILL, DECODE)}
    assert {m["compiler"]["weights"] for m in first.values()} == {"external"}
    assert len({m["files"]["weights.safetensors"]["sha256"] for m in first.values()}) == 1  # one blob

    textgen_kit.save_llama_checkpoint(hf, seed=7)  # the fine-tune: new values, the same config
    assert _build(cfg) == {"compiles": 0, "graph_reused": 2, "failed": 0}
    for tid, old in first.items():
        m = _manifest(cfg, tid)
        assert m["relinked_from"] == old["key"] != m["key"]
        assert m["files"]["model.pt2"] == old["files"]["model.pt2"]                     # the stored graph
        assert m["files"]["weights.safetensors"] != old["files"]["weights.safetensors"]  # the new weights
        e = cli(cfg, "explain", tid)
        assert f"weights changed, graph unchanged: relinked from {old['key']}" in e.stdout, e.stdout
    new = {_manifest(cfg, t)["files"]["weights.safetensors"]["sha256"] for t in first}
    assert len(new) == 1

    bm = BucketedModel.load(_pull(cfg, tmp_path / "serve"))
    ref = textgen_kit.eager(hf)
    g = torch.Generator().manual_seed(5)
    for n in (3, 8):
        prompt = torch.randint(3, 1000, (1, n), generator=g)
        want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, min_new_tokens=12,
                            do_sample=False, pad_token_id=0)
        got = bm.generate(prompt, max_new_tokens=12)
        assert torch.equal(got, want), n
    base = tmp_path / "base"
    textgen_kit.save_llama_checkpoint(base, seed=0)
    old_tokens = textgen_kit.eager(base).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12,
                                                  min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert not torch.equal(old_tokens, want)  # (the fine-tune changes the tokens: the new weights are served)

    # a weights file that does not fit the graph: one line before the package gets any constant
    store = Workspace(load_project(cfg)).store
    art = store.artifact_dir(_manifest(cfg, DECODE)["key"])
    info = json.loads((art / "textgen.json").read_text())
    bad = tmp_path / "bad"
    shutil.copytree(art, bad)
    from safetensors.torch import load_file, save_file
    state = load_file(str(art / "weights.safetensors"))
    state["model.model.norm.weight"] = torch.ones(96)                     # a weight of another shape
    (bad / "weights.safetensors").unlink()
    save_file(state, str(bad / "weights.safetensors"))
    why = "weight model.model.norm.weight is F32 \\[96\\] but the compiled graph expects F32 \\[64\\]"
    with pytest.raises(UserError, match=why) as e:
        AOTIStates().load(bad / "model.pt2", bad / "weights.safetensors", "bad", info, bad)
    assert "\n" not in str(e.value)
    (bad / "weights.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(UserError, match="cannot be read"):
        AOTIStates().load(bad / "model.pt2", bad / "weights.safetensors", "bad2", info, bad)
    assert weights.read_spec(art) is not None

    # a changed vocabulary: other shapes, so the graph compiles (no relink)
    textgen_kit.save_llama_checkpoint(hf, seed=7, vocab_size=1200)
    assert _build(cfg, DECODE, validate=False) == {"compiles": 1, "graph_reused": 0, "failed": 0}
    assert _manifest(cfg, DECODE).get("relinked_from") is None
