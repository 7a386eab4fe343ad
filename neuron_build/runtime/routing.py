"""The routing rules of a pulled release, pure and torch-free: which bucket serves a request of given shapes.

:class:`Router` reads the ``dims``, ``inputs``, ``buckets`` and ``truncate`` of a pulled release's record
(:class:`~neuron_build.runtime.pulled.PulledRelease`) and answers with sizes only (no tensor, no file opened); :class:`neuron_build.runtime.BucketedModel` is a
``Router`` that also runs the artifacts. The rules (numbered as in :mod:`neuron_build.runtime`):

1. **Sizes.** Each input's shape is matched against its symbolic shape (``["batch", "seq"]``): the rank
   and every fixed dim must match, and a bucket dim used by several inputs must have one size in all of
   them. That gives the request's size per bucket dim (``batch=3, seq=40``).
2. **Bucket.** Buckets are ordered by total size (the product of their dim sizes; ties by the sizes in
   dim order), and the first whose every dim is at least the request's is chosen: the smallest bucket
   that fits (:meth:`Router.choose`).
3. **Too large.** A batch larger than the largest batch bucket is split into chunks of the largest
   batch size that fits (:meth:`Router.chunks`); the batch dim is the bucket dim named ``batch`` when it
   leads every input's shape (:attr:`Router.batch_dim`). A request larger than every bucket along another
   bucket dim is a :class:`BucketError` naming the buckets and the fixes, unless ``truncate`` is on: then
   each such dim is cut to the largest size any bucket has. The batch dim is never truncated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.runtime.pulled import RELEASE_FILE, PulledRelease


class BucketError(UserError):
    """An input the release cannot serve: wrong count, rank, fixed dim or dtype, or larger than every
    bucket. The message names the input and what the release expects."""


@dataclass(frozen=True)
class Bucket:
    """One bucket of a pulled release.

    ``sizes``: bucket dim -> size; ``inputs``: concrete input specs (``name``, ``shape`` ints, ``dtype``
    name); ``artifact``: the model file; ``loader``: the function that loads it.
    """

    id: str
    sizes: dict[str, int]
    inputs: tuple[dict[str, Any], ...]
    artifact: Path
    loader: str

    @property
    def total(self) -> int:
        """Product of the bucket's dim sizes (the routing order)."""
        return math.prod(self.sizes.values())

    def describe(self) -> str:
        """``id (dim=size, ...)``, for messages."""
        return f"{self.id} (" + ", ".join(f"{d}={n}" for d, n in self.sizes.items()) + ")"


class Router:
    """The routing rules over a pulled release's record (module docstring): ``release`` as
    :func:`~neuron_build.runtime.pulled.read_pulled` reads it from a pulled folder, or
    :meth:`PulledRelease.from_json` from ``release.json`` content; ``root`` is the pulled folder (bucket
    artifacts are ``root / artifact``; nothing is opened here).

    Attributes:
        release: the record.
        dims: the bucket dim names; specs: the symbolic input specs (``name``, ``shape``, ``dtype``, ...).
        buckets: in routing order (smallest total size first).
        batch_dim: the bucket dim split into chunks when a batch is larger than every bucket: ``batch`` when
            it is a bucket dim leading every input (else None: no chunking).
    """

    def __init__(self, release: PulledRelease, root: Path | str = "."):
        self.release = release
        self.root = Path(root)
        self.dims: list[str] = list(release.dims)
        self.specs: list[dict[str, Any]] = list(release.inputs)
        self.truncate: bool = release.truncate
        bs = [Bucket(b.id, {d: int(b.sizes[d]) for d in self.dims if d in b.sizes}, tuple(b.inputs),
                     self.root / b.artifact, b.loader) for b in release.buckets]
        self.buckets: list[Bucket] = sorted(bs, key=lambda b: (b.total, tuple(b.sizes.get(d, 0) for d in self.dims)))
        lead = {spec["shape"][0] if spec["shape"] else None for spec in self.specs}
        self.batch_dim: str | None = "batch" if "batch" in self.dims and lead == {"batch"} else None

    def _sizes(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """Rule 1: the request's size per bucket dim.

        Raises:
            BucketError: wrong count of inputs, rank, fixed dim, a non-positive size, or inputs that disagree
                on a dim.
        """
        if len(shapes) != len(self.specs):
            raise BucketError(f"{self.release.model} takes {len(self.specs)} input(s) "
                              f"({', '.join(s['name'] for s in self.specs)}), got {len(shapes)}")
        sizes: dict[str, tuple[int, str]] = {}
        for spec, shape in zip(self.specs, shapes, strict=True):
            shape = tuple(int(n) for n in shape)
            sym = spec["shape"]
            if len(shape) != len(sym):
                raise BucketError(f"input '{spec['name']}' has shape {list(shape)}; expected {len(sym)} dims "
                                  f"{sym}")
            for i, (d, n) in enumerate(zip(sym, shape, strict=True)):
                if isinstance(d, str):
                    if n < 1:
                        raise BucketError(f"input '{spec['name']}' dim {i} ({d}) is {n}; sizes must be positive")
                    if d in sizes and sizes[d][0] != n:
                        raise BucketError(f"dim '{d}' is {sizes[d][0]} in input '{sizes[d][1]}' but {n} in "
                                          f"input '{spec['name']}'; inputs must agree")
                    sizes.setdefault(d, (n, spec["name"]))
                elif n != d:
                    raise BucketError(f"input '{spec['name']}' dim {i} is {n}; the release is compiled for "
                                      f"{d} (shape {sym})")
        return {d: n for d, (n, _) in sizes.items()}

    def route(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> tuple[Bucket, dict[str, int]]:
        """The bucket for inputs of these shapes, and the sizes the outputs are sliced to (the request's,
        after truncation of sequence dims). A batch larger than every bucket is routed as its first chunk
        (:meth:`chunks`).

        Args:
            shapes: one shape per input, in input order, or a mapping input name -> shape.

        Raises:
            BucketError: a shape does not match the inputs, or is larger than every bucket along a
                sequence dim and truncation is off.
        """
        if isinstance(shapes, Mapping):
            missing = [s["name"] for s in self.specs if s["name"] not in shapes]
            if missing:
                raise BucketError(f"no shape given for input(s) {', '.join(missing)}")
            shapes = [shapes[s["name"]] for s in self.specs]
        want = self._sizes(list(shapes))
        return self._route_sizes({**want, **({self.batch_dim: self.chunks(want)[0]} if self.batch_dim else {})},
                                 want)

    def chunks(self, want: dict[str, int]) -> list[int]:
        """The batch sizes of the chunks a request of sizes ``want`` is run in: one chunk when a bucket
        takes the whole batch, else chunks of the largest batch size among the buckets that fit the
        other dims (the last chunk holds the rest); empty without a batch dim."""
        bd = self.batch_dim
        if bd is None:
            return []
        n = want[bd]
        fits = [b.sizes[bd] for b in self.buckets if all(b.sizes[d] >= self._cut(d, m) for d, m in want.items() if d != bd)]
        top = max(fits) if fits else max(b.sizes[bd] for b in self.buckets)
        if n <= top:
            return [n]
        return [top] * (n // top) + ([n % top] if n % top else [])

    def _cut(self, d: str, n: int) -> int:
        if self.truncate and d != self.batch_dim:
            return min(n, max(b.sizes[d] for b in self.buckets))
        return n

    def _route_sizes(self, want: dict[str, int], request: dict[str, int]) -> tuple[Bucket, dict[str, int]]:
        """Rules 2 and 3 for sizes ``want`` (a chunk's) of a request of sizes ``request`` (messages)."""
        cut = {d: self._cut(d, n) for d, n in want.items()}
        for b in self.buckets:
            if all(b.sizes[d] >= n for d, n in cut.items()):
                return b, cut
        model = self.release.model
        req = ", ".join(f"{d}={n}" for d, n in request.items())
        over = [d for d, n in cut.items() if n > max(b.sizes[d] for b in self.buckets)]
        fix = "; ".join(f"add a bucket with {d} >= {cut[d]} to [models.{model}] buckets in buckets.toml"
                        for d in over) or f"add a bucket that fits {req} to [models.{model}] buckets"
        trunc = [d for d in over if d != self.batch_dim]
        hint = (f"; or set truncate = true under [models.{model}] to cut {', '.join(trunc)} to the largest bucket "
                f"(drops the rest)" if trunc and not self.truncate else "")
        raise BucketError(f"inputs of {req} are larger than every bucket of {model} ({self.release.release}): "
                          f"{', '.join(b.describe() for b in self.buckets)}. Fix: {fix}, then build, release, "
                          f"promote and pull again{hint} (serving options are read from the pulled {RELEASE_FILE})")

    def choose(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> str:
        """The id of the bucket inputs of these shapes are routed to (e.g. ``b8-s64``)."""
        return self.route(shapes)[0].id

    def prefill_bucket(self, prompt_len: int) -> Bucket | None:
        """A text-generation release: the prefill bucket a prompt of ``prompt_len`` tokens is counted against
        (the smallest ``seq`` bucket that holds it, as the engine routes; ties by batch), None when none
        holds it."""
        graphs = (self.release.textgen or {}).get("graphs") or {}
        prefill = sorted((b for b in self.buckets if graphs.get(b.id) == "prefill" and "seq" in b.sizes),
                         key=lambda b: (b.sizes["seq"], b.sizes.get("batch", 1)))
        return next((b for b in prefill if b.sizes["seq"] >= prompt_len), None)


__all__ = ["Bucket", "BucketError", "Router"]
