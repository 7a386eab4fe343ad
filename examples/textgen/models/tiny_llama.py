"""A tiny Llama with RANDOM weights (no checkpoint): transformers' own ``LlamaForCausalLM`` made from a config
with a fixed seed, so every build makes the same weights. It generates gibberish; it exists to show and test
the prefill/decode build, not to be a language model."""

from __future__ import annotations


def build(hidden_size: int = 64, layers: int = 2, vocab_size: int = 1000, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab_size,
                      max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      attn_implementation="eager")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()
