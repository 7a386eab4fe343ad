"""The transformer feed-forward block: Linear(hidden -> inner), GELU, Linear(inner -> hidden), residual,
LayerNorm. Input ``[batch, seq, hidden]``; output the same shape and dtype."""

import torch
from torch import nn


class FFN(nn.Module):
    """Post-norm FFN block: ``LayerNorm(x + W2 GELU(W1 x))``.

    Args:
        hidden: model width (input and output last dim).
        inner: intermediate width (4 x hidden in BERT-style blocks).
        eps: LayerNorm epsilon.
    """

    def __init__(self, hidden: int = 1024, inner: int = 4096, eps: float = 1e-5):
        super().__init__()
        self.up = nn.Linear(hidden, inner)
        self.act = nn.GELU()
        self.down = nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(self.act(self.up(x))))


def build(hidden: int = 1024, inner: int = 4096, seed: int = 0) -> FFN:
    """An FFN block with deterministic random weights (seeded), fp32; the build casts it to the target dtype."""
    torch.manual_seed(seed)
    return FFN(hidden, inner)
