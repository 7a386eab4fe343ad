"""Text-generation graphs (:mod:`neuron_build.compilers.textgen`) without a compile: a checkpoint folder as
published (generation_config.json naming only bos/eos) gets the static-cache options it lacks."""

from __future__ import annotations

import pytest

from neuron_build.compilers.textgen import causal_lm, graph_inputs, static_wrapper
from tests.helpers import textgen as textgen_kit


def test_a_checkpoint_whose_generation_config_names_only_bos_and_eos_gets_a_static_cache(tmp_path):
    """transformers 5 leaves generation_config.use_cache None for such a folder, and its exportable wrapper
    refused it ("The model must have caching enabled to be exported with static caching"): every prefill
    graph of a published Llama failed. The wrapper now builds and its prefill logits are the eager model's."""
    import torch

    folder = textgen_kit.save_llama_checkpoint(tmp_path / "ck")
    lm = textgen_kit.eager(folder)
    assert lm.generation_config.use_cache is not True  # as published: not named
    want = lm(torch.tensor([[5, 6, 7, 8]])).logits
    w = static_wrapper(causal_lm(lm), 1, 16)
    assert lm.generation_config.use_cache is True and lm.generation_config.cache_implementation == "static"
    x = graph_inputs("prefill", 1, 8)
    x["input_ids"][0, :4] = torch.tensor([5, 6, 7, 8])
    with torch.no_grad():
        got = w(**x)
    assert got.shape == (1, 8, 1000)
    assert torch.allclose(got[:, :4], want, atol=1e-5)


def test_a_module_without_a_generation_config_is_refused():
    import torch

    from neuron_build.compilers.base import CompileFailed

    with pytest.raises(CompileFailed, match="must be a transformers causal LM"):
        causal_lm(torch.nn.Linear(2, 2))
