"""Tiny decoder LMs for the text-generation tests: transformers' own Llama and GPT-2 code with RANDOM
weights (a fixed seed), saved as hf folders, and a project that builds them."""

from __future__ import annotations

from pathlib import Path

#: One compile thread per AOTInductor compile (a shared 2-core host); not a graph-changing setting.
ENV = {"TORCHINDUCTOR_COMPILE_THREADS": "1"}


def llama_config(**changes):
    """The tiny Llama's ``LlamaConfig`` (2 layers, hidden 64, vocab 1000), ``changes`` applied."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128, bos_token_id=1,
                                 eos_token_id=2, pad_token_id=0), **changes})


def save_llama(folder: Path, seed: int = 0, **changes) -> Path:
    """A 2-layer Llama (hidden 64, vocab 1000; ``changes`` to its config) with random weights from ``seed``,
    saved with save_pretrained."""
    import torch
    from transformers import LlamaForCausalLM

    cfg = llama_config(**changes)
    torch.manual_seed(seed)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def save_llama_checkpoint(folder: Path, seed: int = 0, **changes) -> Path:
    """:func:`save_llama`, its ``generation_config.json`` then trimmed to bos/eos as published checkpoints
    have it (Llama-2's names only bos/eos and sampling fields: no ``use_cache``, no ``pad_token_id``)."""
    import json

    save_llama(folder, seed, **changes)
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2) + "\n")
    return folder


def save_gpt2(folder: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 (hidden 64, vocab 1000) with random weights from ``seed``, saved with save_pretrained."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=1,
                     eos_token_id=2)
    torch.manual_seed(seed)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


def eager(folder: Path):
    """The eager fp32 model of an hf folder (the reference): ``AutoModelForCausalLM``, eager attention."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()


def write_project(root: Path, backend: str = "inductor", llama_buckets: str = "{ batch = [2], seq = [8, 16] }",
                  gpt2: bool = True, extra: str = "", profile: str = "") -> Path:
    """A project of ``llama`` (and ``gpt2``, batch 1, seq 8) text-generation models, max_seq_len 64. The
    llama folder is checkpoint-style (:func:`save_llama_checkpoint`: generation_config.json with bos/eos only).
    ``profile``: more lines of ``[profiles.p1]`` (``weights = "external"``); ``extra``: more of ``[models.llama]``."""
    root.mkdir(parents=True, exist_ok=True)
    save_llama_checkpoint(root / "hf-llama")
    text = f"""
[build]
backend = "{backend}"
device = "cpu"
timeout_s = 1800

[profiles.p1]
compiler_args = []
{profile}

[models.llama]
task = "text-generation"
hf = "hf-llama"
dtypes = ["fp32"]
profiles = ["p1"]
max_seq_len = 64
buckets = {llama_buckets}
{extra}
"""
    if gpt2:
        save_gpt2(root / "hf-gpt2")
        text += """
[models.gpt2]
task = "text-generation"
hf = "hf-gpt2"
auto_class = "AutoModelForCausalLM"
dtypes = ["fp32"]
profiles = ["p1"]
max_seq_len = 64
buckets = { batch = [1], seq = [8] }
"""
    (root / "buckets.toml").write_text(text)
    return root / "buckets.toml"
