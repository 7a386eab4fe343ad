"""RMS normalisation over the last dim, two ways that must agree.

``naive`` writes it out (square, mean, add eps, rsqrt, scale by weight); ``fused`` calls
``torch.nn.functional.rms_norm``. Both take an explicit ``eps`` (default here 1e-6) and an explicitly
typed weight: leaving ``rms_norm``'s eps at its default (``torch.finfo(dtype).eps``) is the classic
mismatch between an eager and a fused implementation.
"""

import torch
from torch import nn


class RMSNormNaive(nn.Module):
    """``y = x * rsqrt(mean(x^2, -1) + eps) * weight``, computed in fp32 and cast back to x's dtype.

    Input ``[..., dim]``; output same shape and dtype.
    """

    def __init__(self, dim: int, eps: float = 1e-6, weight_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=weight_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class RMSNormFused(nn.Module):
    """``torch.nn.functional.rms_norm`` with an explicit eps, computed in fp32 and cast back.

    Input ``[..., dim]``; output same shape and dtype.
    """

    def __init__(self, dim: int, eps: float | None = 1e-6, weight_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=weight_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.rms_norm(x.float(), (self.dim,), self.weight.float(), eps=self.eps)
        return y.to(x.dtype)


def _weights(dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 1.0 + 0.1 * torch.randn(dim, generator=g)


def naive(dim: int = 512, eps: float = 1e-6, seed: int = 0) -> RMSNormNaive:
    """The written-out RMSNorm with a seeded, non-trivial fp32 weight."""
    m = RMSNormNaive(dim, eps, torch.float32)
    with torch.no_grad():
        m.weight.copy_(_weights(dim, seed))
    return m


def fused(dim: int = 512, eps: float | None = 1e-6, seed: int = 0) -> RMSNormFused:
    """``F.rms_norm`` RMSNorm with the same seeded fp32 weight as :func:`naive`. ``eps=None`` reproduces
    the default-eps trap."""
    m = RMSNormFused(dim, eps, torch.float32)
    with torch.no_grad():
        m.weight.copy_(_weights(dim, seed))
    return m
