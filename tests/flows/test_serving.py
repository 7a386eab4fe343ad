"""Serving you can trust (issue 30, items 1-4), on real AOTInductor releases pulled as a deploy host does: a
tiny embedding model (declared ranges) and a tiny Llama (transformers' code, random weights), batch 2, seq 8.

Every bad input is an exception and the process lives (AOTInductor's own index check aborts the process with
SIGABRT, so the checks must run first); two threads on one model each get their own answer; a tampered file is
refused at load; generate() equals transformers' greedy generate(). One module-scoped build (3 compiles)."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

EMB = '''
"""A token embedding and a projection, masked: the smallest model that indexes by its input ids."""
import torch
from torch import nn


class Emb(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(100, 8)
        self.lin = nn.Linear(8, 4)

    def forward(self, input_ids, attention_mask):
        return self.lin(self.emb(input_ids)) * attention_mask.unsqueeze(-1)


def build():
    return Emb()
'''

CONFIG = '''
[build]
backend = "inductor"
device = "cpu"
timeout_s = 1800

[profiles.p1]
compiler_args = []

[models.emb]
factory = "servelib.emb:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [
  { name = "input_ids", shape = ["batch", "seq"], dtype = "int64", range = [0, 100] },
  { name = "attention_mask", shape = ["batch", "seq"], dtype = "int64", range = [1, 2] },
]
buckets = { batch = [1], seq = [8] }

[models.llama]
task = "text-generation"
hf = "hf-llama"
dtypes = ["fp32"]
profiles = ["p1"]
max_seq_len = 64
buckets = { batch = [2], seq = [8] }
'''


def cli(cfg: Path, *args: str):
    return run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=textgen_kit.ENV, timeout=1800)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Both models built, released, promoted to dev (unvalidated) and pulled: {model: folder, "root": project}."""
    root = tmp_path_factory.mktemp("serving") / "proj"
    (root / "servelib").mkdir(parents=True)
    (root / "servelib" / "__init__.py").write_text("")
    (root / "servelib" / "emb.py").write_text(EMB)
    textgen_kit.save_llama(root / "hf-llama")
    cfg = root / "buckets.toml"
    cfg.write_text(CONFIG)
    r = cli(cfg, "build", "-n", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = {"root": root}
    for model in ("emb", "llama"):
        rel = json.loads(cli(cfg, "release", model, "--json").stdout)
        r = cli(cfg, "promote", model, rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "serving test")
        assert r.returncode == 0, r.stdout + r.stderr
        out[model] = root.parent / f"serve-{model}"
        r = cli(cfg, "pull", model, "--channel", "dev", "--dest", str(out[model]))
        assert r.returncode == 0, r.stdout + r.stderr
    return out


def _eager_emb(root: Path):
    sys.path.insert(0, str(root))
    try:
        from servelib.emb import build
    finally:
        sys.path.remove(str(root))
    return build().eval()


def test_generate_equals_transformers_greedy(served):
    """Batch 1 and 2, left padding, one row meeting eos (the other goes on; the finished row is padded with
    the model's pad_token_id, 0), eos lists and an explicit pad_token_id: token for token as transformers."""
    import torch

    from neuron_build.runtime import BucketedModel

    lm = BucketedModel.load(served["llama"])
    ref = textgen_kit.eager(served["root"] / "hf-llama")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randint(3, 1000, (1, 7), generator=g), torch.randint(3, 1000, (1, 4), generator=g)
    ids = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = (torch.arange(7) >= torch.tensor([[0], [3]])).long()
    free = ref.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                        pad_token_id=0)
    assert torch.equal(lm.generate(ids, attention_mask=mask, max_new_tokens=8), free)
    new = free[:, 7:]
    # an eos that row 1 meets at its 3rd new token and row 0 never does
    eos = next(int(t) for t in new[1, 2:] if int(t) not in new[0].tolist() and int(t) not in new[1, :2].tolist())
    for kw in ({"eos_token_id": eos}, {"eos_token_id": [eos, 999 if eos != 999 else 998]},
               {"eos_token_id": eos, "pad_token_id": 7}):
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, **kw)
        got = lm.generate(ids, attention_mask=mask, max_new_tokens=8, **kw)
        assert torch.equal(got, want), kw
        assert int(want[1, -1]) == kw.get("pad_token_id", 0) and int(want[0, -1]) != int(want[1, -1])
    # batch 1, the prompt alone, meeting eos: stops there as transformers does
    row = ids[1:, 3:]
    want = ref.generate(row, max_new_tokens=8, do_sample=False, eos_token_id=eos)
    assert torch.equal(lm.generate(row, max_new_tokens=8, eos_token_id=eos), want)
    assert want.shape[1] < row.shape[1] + 8


def test_a_tampered_file_is_refused_at_load(served, tmp_path):
    """load checks every file against release.json: sha256 by default (one line naming the file), size only
    with verify="size" (for hosts that verified at pull); a changed size is refused either way."""
    from neuron_build.errors import UserError
    from neuron_build.runtime import BucketedModel

    for model, name in (("llama", "weights.safetensors"), ("emb", "model.pt2")):
        dest = tmp_path / model
        shutil.copytree(served[model], dest)
        f = sorted(dest.rglob(name))[0]
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF  # the last byte of a weight (llama), of the zip's directory (emb)
        f.write_bytes(bytes(data))
        with pytest.raises(UserError) as e:
            BucketedModel.load(dest)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{f}: sha256 ") and "release.json lists" in msg
        assert "pull the release again" in msg
        if model == "llama":  # the documented opt-out checks sizes only: a same-size change loads
            assert BucketedModel.load(dest, verify="size").textgen is not None
        f.write_bytes(bytes(data[:-1]))
        with pytest.raises(UserError, match=rf"{f}: {len(data) - 1} bytes, release.json lists {len(data)}"):
            BucketedModel.load(dest, verify="size")
    with pytest.raises(UserError, match=r"verify='md5'; give 'sha256' \(the default\) or 'size'"):
        BucketedModel.load(served["emb"], verify="md5")


def test_every_bad_input_then_two_threads_then_a_good_request(served):
    """In one process: each bad input is one BucketError/GenerateError naming input, value and allowed range
    (none reaches a kernel: AOTInductor's check would abort the process); then two threads generate on one
    model, each its own right answer; then good requests equal the eager models."""
    import torch

    from neuron_build.compilers.textgen_serve import GenerateError
    from neuron_build.runtime import BucketedModel, BucketError

    emb = BucketedModel.load(served["emb"])
    assert [i.get("range") for i in emb.release.inputs] == [[0, 100], [1, 2]]  # recorded by release, pulled
    ids, mask = torch.randint(0, 100, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    bad_ids = ids.clone()
    bad_ids[0, 3] = 100
    with pytest.raises(BucketError) as e:
        emb(bad_ids, mask)
    assert str(e.value) == ("input 'input_ids' holds 100 at [0, 3]; release "
                            f"{emb.release.release} of emb allows values in [0, 100) (the declared range)")
    bad_ids[0, 3] = -1
    with pytest.raises(BucketError, match=r"input 'input_ids' holds -1 at \[0, 3\];.* allows values in \[0, 100\)"):
        emb(bad_ids, mask)
    big = torch.full((1, 8), 40000)  # as minilm's 40000 against range [0, 30522)
    with pytest.raises(BucketError, match=r"input 'input_ids' holds 40000 at \[0, 0\]"):
        emb(big, mask)
    with pytest.raises(BucketError, match=r"input 'attention_mask' holds 2 at \[0, 0\];.* allows values in \[1, 2\) "
                                          r"or 0 \(its pad value\)"):
        emb(ids, mask * 2)
    with pytest.raises(BucketError, match="input 'input_ids' is a list; give a torch.Tensor"):
        emb(ids.tolist(), mask)
    with pytest.raises(BucketError, match="input 'input_ids' is torch.float32"):
        emb(ids.float(), mask)

    lm = BucketedModel.load(served["llama"])
    prompt = torch.randint(3, 1000, (1, 5), generator=torch.Generator().manual_seed(1))
    for bad, want in [
            (torch.tensor([[5, 1000, 7]]), r"input_ids holds 1000 at \[0, 1\]; llama's vocabulary is ids 0 to 999"),
            (torch.tensor([[5, -1, 7]]), r"input_ids holds -1 at \[0, 1\]; llama's vocabulary is ids 0 to 999"),
            (torch.tensor([[3.7, 5.0]]), r"input_ids is torch.float32; token ids are integers"),
            (torch.zeros(1, 0, dtype=torch.long), r"input_ids has no tokens \(shape \[1, 0\]\)"),
            ([[5, 6]], r"input_ids must be a 2-D torch.Tensor")]:
        with pytest.raises(GenerateError, match=want):
            lm.generate(bad, max_new_tokens=2)
    for n in (2.5, 0, True, "3", None):
        with pytest.raises(GenerateError, match=rf"max_new_tokens is {n!r}; give a whole number >= 1"):
            lm.generate(prompt, max_new_tokens=n)
    with pytest.raises(GenerateError) as e:
        lm.generate(torch.randint(3, 1000, (1, 70)), max_new_tokens=2)
    assert str(e.value) == (
        "a prompt of 70 tokens does not fit the KV cache of llama (max_seq_len = 64) with a new token; give at most "
        "63 prompt tokens, or raise max_seq_len in [models.llama] above 71 and add a seq bucket >= 70, then build, "
        "release, promote and pull again")
    with pytest.raises(GenerateError, match=r"a prompt of 8 tokens plus max_new_tokens = 60 exceeds the KV cache of "
                                            r"llama \(max_seq_len = 64\); ask for at most 56 new tokens"):
        lm.generate(torch.randint(3, 1000, (1, 8)), max_new_tokens=60)
    with pytest.raises(GenerateError, match=r"eos_token_id holds 1\.5; give a token id or a list of them"):
        lm.generate(prompt, max_new_tokens=2, eos_token_id=[2, 1.5])
    with pytest.raises(GenerateError, match=r"attention_mask holds 2 at \[0, 0\]; it takes 0 \(padding\) and 1"):
        lm.generate(prompt, attention_mask=torch.full((1, 5), 2), max_new_tokens=2)

    # two threads on one model: each caller gets its own answer (one KV state per batch size is shared)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 1000, (1, 4 + k), generator=g) for k in range(2)]
    expected = [lm.generate(p, max_new_tokens=12) for p in prompts]
    wrong: list[tuple[int, int]] = []

    def serve(k: int) -> None:
        for i in range(6):
            if not torch.equal(lm.generate(prompts[k], max_new_tokens=12), expected[k]):
                wrong.append((k, i))
    threads = [threading.Thread(target=serve, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # and plain calls from two threads (they keep no state: each its own answer)
    batches = [torch.randint(0, 100, (1, 3 + k), generator=g) for k in range(2)]
    want_emb = [emb(b, torch.ones_like(b)) for b in batches]

    def call(k: int) -> None:
        for i in range(20):
            if not torch.equal(emb(batches[k], torch.ones_like(batches[k])), want_emb[k]):
                wrong.append((k + 2, i))
    threads += [threading.Thread(target=call, args=(k,)) for k in range(2)]
    for t in threads[2:]:
        t.start()
    for t in threads[2:]:
        t.join()
    assert wrong == []

    # good requests after all that: equal to the eager models
    ref = textgen_kit.eager(served["root"] / "hf-llama")
    want = ref.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(lm.generate(prompt, max_new_tokens=6), want)
    with torch.no_grad():
        torch.testing.assert_close(emb(ids, mask), _eager_emb(served["root"])(ids, mask), rtol=1e-5, atol=1e-6)
