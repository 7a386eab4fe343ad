"""The routing rules alone (:mod:`neuron_build.runtime.routing`): sizes in, a bucket out, without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuron_build.runtime.pulled import PulledRelease
from neuron_build.runtime.routing import BucketError, Router
from tests.helpers.cli import REPO


def release(truncate: bool = False, textgen: bool = False) -> PulledRelease:
    """The record of :func:`release_json`."""
    return PulledRelease.from_json(release_json(truncate, textgen), "release.json")


def release_json(truncate: bool = False, textgen: bool = False) -> dict:
    """A release.json of inputs ids [batch, seq] and feats [batch, seq, 4]; buckets batch [1, 2, 4] x seq [8, 16]
    (for ``textgen``: seq 8 and 16 prefill graphs, and seq 1 decode graphs)."""
    inputs = [{"name": "ids", "shape": ["batch", "seq"], "dtype": "int64"},
              {"name": "feats", "shape": ["batch", "seq", 4], "dtype": "fp32"}]
    buckets, graphs = [], {}
    for b in (4, 2, 1):
        for s in (16, 8, 1) if textgen else (16, 8):
            bid = f"b{b}-s{s}"
            graphs[bid] = "decode" if s == 1 else "prefill"
            buckets.append({"id": bid, "target": f"enc/{bid}/fp32/p1", "key": "0" * 64, "sizes": {"batch": b, "seq": s}, "artifact": f"{bid}/model.pt",
                            "loader": "torch.jit.load", "files": {},
                            "inputs": [{"name": "ids", "shape": [b, s], "dtype": "int64"},
                                       {"name": "feats", "shape": [b, s, 4], "dtype": "fp32"}]})
    rel = {"release": "r1", "model": "enc", "backend": "torchscript", "dims": ["batch", "seq"], "inputs": inputs,
           "buckets": buckets, "truncate": truncate}
    if textgen:
        rel["textgen"] = {"graphs": graphs, "max_seq_len": 32}
    return rel


@pytest.mark.parametrize("batch,seq,bucket", [(1, 1, "b1-s8"), (1, 9, "b1-s16"), (2, 8, "b2-s8"), (3, 1, "b4-s8"),
                                              (3, 16, "b4-s16"), (4, 16, "b4-s16")])
def test_the_smallest_bucket_that_fits(batch, seq, bucket):
    r = Router(release())
    assert r.choose([(batch, seq), (batch, seq, 4)]) == bucket
    assert r.choose({"ids": (batch, seq), "feats": (batch, seq, 4)}) == bucket
    b, sizes = r.route([(batch, seq), (batch, seq, 4)])
    assert (b.id, sizes) == (bucket, {"batch": batch, "seq": seq})


def test_buckets_in_routing_order_and_the_batch_dim():
    r = Router(release())
    assert [(b.id, b.total) for b in r.buckets] == [("b1-s8", 8), ("b1-s16", 16), ("b2-s8", 16), ("b2-s16", 32),
                                                    ("b4-s8", 32), ("b4-s16", 64)]
    assert r.batch_dim == "batch"
    assert r.buckets[0].describe() == "b1-s8 (batch=1, seq=8)"


def test_a_batch_larger_than_every_bucket_is_chunked():
    r = Router(release())
    assert r.chunks({"batch": 9, "seq": 5}) == [4, 4, 1]
    assert r.chunks({"batch": 3, "seq": 5}) == [3]
    b, sizes = r.route([(9, 5), (9, 5, 4)])  # routed as its first chunk
    assert (b.id, sizes) == ("b4-s8", {"batch": 4, "seq": 5})


def test_too_long_is_an_error_naming_the_fix_unless_truncate():
    with pytest.raises(BucketError) as e:
        Router(release()).route([(2, 40), (2, 40, 4)])
    msg = str(e.value)
    assert "\n" not in msg
    assert "inputs of batch=2, seq=40 are larger than every bucket of enc (r1)" in msg
    assert "add a bucket with seq >= 40 to [models.enc] buckets in buckets.toml" in msg
    assert "or set truncate = true under [models.enc]" in msg
    b, sizes = Router(release(truncate=True)).route([(2, 40), (2, 40, 4)])
    assert (b.id, sizes) == ("b2-s16", {"batch": 2, "seq": 16})


@pytest.mark.parametrize("shapes,message", [
    ([(2, 8)], "enc takes 2 input(s) (ids, feats), got 1"),
    ([(2, 8), (2, 8)], "input 'feats' has shape [2, 8]; expected 3 dims ['batch', 'seq', 4]"),
    ([(2, 8), (2, 8, 5)], "input 'feats' dim 2 is 5; the release is compiled for 4"),
    ([(2, 8), (2, 7, 4)], "dim 'seq' is 8 in input 'ids' but 7 in input 'feats'; inputs must agree"),
    ([(0, 8), (0, 8, 4)], "input 'ids' dim 0 (batch) is 0; sizes must be positive"),
])
def test_shapes_that_do_not_match_the_inputs(shapes, message):
    with pytest.raises(BucketError, match="^" + message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        Router(release()).route(shapes)


def test_the_prefill_bucket_of_a_prompt():
    r = Router(release(textgen=True))
    assert r.prefill_bucket(1).id == "b1-s8"  # never a decode graph, though seq 1 is smaller
    assert r.prefill_bucket(9).id == "b1-s16"
    assert r.prefill_bucket(17) is None
    assert Router(release()).prefill_bucket(3) is None  # not a text-generation release


def test_routing_needs_no_torch():
    """The rules run in a process that never imports torch (a router in front of the model servers)."""
    code = (f"import json, sys; from neuron_build.runtime.routing import Router; "
            f"from neuron_build.runtime.pulled import PulledRelease; "
            f"rel = PulledRelease.from_json(json.loads({json.dumps(release_json())!r}), 'release.json'); "
            f"print(Router(rel).choose([(3, 9), (3, 9, 4)]), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split() == ["b4-s16", "False"], out.stderr
