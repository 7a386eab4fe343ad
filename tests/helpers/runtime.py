"""Stand-ins for compiled artifacts: a release of a three-input model whose buckets are plain callables that
record their calls, for the runtime's rules without a compile."""

from __future__ import annotations

from pathlib import Path

import torch

from neuron_build.runtime import BucketedModel, PulledRelease


def fake_release(truncate: bool = False, convert: bool = False) -> dict:
    """A release.json of a model with inputs ids [batch, seq] int64 (pad 0), mask [batch, seq] int64 (pad 0)
    and feats [batch, seq, 4] fp32 (pad -1), buckets batch [1, 2, 4] x seq [8, 16]."""
    inputs = [{"name": "ids", "shape": ["batch", "seq"], "dtype": "int64", "pad": 0},
              {"name": "mask", "shape": ["batch", "seq"], "dtype": "int64", "pad": 0},
              {"name": "feats", "shape": ["batch", "seq", 4], "dtype": "fp32", "pad": -1.0}]
    buckets = []
    for b in (4, 2, 1):
        for s in (16, 8):
            buckets.append({"id": f"b{b}-s{s}", "target": f"enc/b{b}-s{s}/fp32/p1", "key": f"{b:02d}{s:02d}" * 16,
                            "sizes": {"batch": b, "seq": s}, "artifact": f"b{b}-s{s}/model.pt",
                            "loader": "torch.jit.load", "files": {},
                            "inputs": [{"name": "ids", "shape": [b, s], "dtype": "int64"},
                                       {"name": "mask", "shape": [b, s], "dtype": "int64"},
                                       {"name": "feats", "shape": [b, s, 4], "dtype": "fp32"}]})
    return {"release": "r-fake", "model": "enc", "dims": ["batch", "seq"], "inputs": inputs, "buckets": buckets,
            "truncate": truncate, "convert_dtypes": convert, "backend": "torchscript"}


class Recorder:
    """Stands in for one bucket's artifact: records what it was called with, returns three outputs:
    per-token [B, S, 3], pooled [B, 3], and a constant [7]."""

    def __init__(self, bucket: str):
        self.bucket = bucket
        self.calls: list[tuple[torch.Tensor, ...]] = []

    def __call__(self, ids, mask, feats):
        self.calls.append((ids, mask, feats))
        per_token = (ids * mask).to(torch.float32).unsqueeze(-1).repeat(1, 1, 3)
        pooled = feats.sum(dim=1)[:, :3]
        return per_token, pooled, torch.arange(7.0)


def fake_model(**kw) -> tuple[BucketedModel, dict[str, Recorder]]:
    rel = PulledRelease.from_json(fake_release(**kw), "fake release.json")
    mods = {b.id: Recorder(b.id) for b in rel.buckets}
    return BucketedModel(rel, Path("/nonexistent"), modules=mods), mods

