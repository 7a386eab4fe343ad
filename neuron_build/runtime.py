"""Serving a pulled release: route each call to the smallest static-shape bucket that fits.

``BucketedModel.load(DIR)`` reads ``DIR/release.json`` (written by ``neuron-build pull``) and loads every
bucket's artifact with its loader (:func:`neuron_build.artifact.load_artifact`): ``torch.jit.load`` for
``.pt`` (TorchScript, and Neuron artifacts, which are TorchScript modules holding the NEFF and are placed on
a NeuronCore when loaded [doc: toolchain notes]), ``torch._inductor.aoti_load_package`` for ``.pt2``
(AOTInductor).

Routing rules, per call:

1. **Sizes.** Each input's shape is matched against its symbolic shape (``["batch", "seq"]``): the rank
   and every fixed dim must match, and a bucket dim used by several inputs must have one size in all of
   them. That gives the request's size per bucket dim (``batch=3, seq=40``).
2. **Bucket.** Buckets are ordered by total size (the product of their dim sizes; ties by the sizes in
   dim order), and the first whose every dim is at least the request's is chosen: the smallest bucket
   that fits. ``choose(shapes)`` returns its id without running anything.
3. **Too large.** A batch larger than the largest batch bucket is split into chunks of the largest
   batch size that fits, each chunk routed and run on its own, and the outputs put back together along
   the batch dim: 9 inputs with batch buckets up to 8 give 9 outputs (a chunk of 8 and one of 1). The
   batch dim is the bucket dim named ``batch`` when it leads every input's shape (:attr:`BucketedModel.batch_dim`).
   A request larger than every bucket along a sequence dim (any other bucket dim) is an error naming the
   buckets and the fixes, unless the model's config says ``truncate = true``: then each such dim is cut to
   the largest size any bucket has (the leading part is kept), and the outputs have the cut size. The
   batch dim is never truncated.
4. **Dtypes.** An input whose dtype differs from the artifact's is an error naming the input, its dtype
   and the expected one, unless the config says ``convert_dtypes = true`` (then it is converted).
5. **Padding.** Each input is padded at the end of every bucket dim up to the bucket's size with its
   ``pad`` value (config; default 0, which for BERT-style models is the pad token id and, for an
   attention mask, "masked out").
6. **Outputs.** Each output tensor is sliced back to the request's sizes along the dims that match a
   padded input: the input whose padded shape shares the longest leading prefix with the output's shape
   (at least one dim, including a bucket dim) decides, and positions of that prefix that are bucket dims
   are sliced (``[8, 64, 384]`` from inputs ``[8, 64]`` -> ``[3, 40, 384]``; a pooled ``[8, 384]`` ->
   ``[3, 384]``). Outputs that share no such prefix with any input are returned as they are.
7. **Chunks.** With a split batch, each output that leads with the chunk's batch size is concatenated
   along dim 0 across chunks; any other output is the first chunk's.

The serving options (``pad``, ``truncate``, ``convert_dtypes``, the inputs and buckets) are read from the
pulled ``release.json``, which ``neuron-build release`` recorded from ``buckets.toml``: changing them in
``buckets.toml`` takes effect on a serving host after ``release``, ``promote`` and ``pull`` again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.artifact import load_artifact, release_version_problem
from neuron_build.errors import UserError
from neuron_build.examples import torch_dtype


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
        return f"{self.id} (" + ", ".join(f"{d}={n}" for d, n in self.sizes.items()) + ")"


class BucketedModel:
    """A pulled release, callable like the model: routes, pads, runs and slices (see the module
    docstring for the rules).

    Attributes:
        release: the ``release.json`` content.
        buckets: in routing order (smallest total size first).
        dims: the bucket dim names.
    """

    def __init__(self, release: dict[str, Any], root: Path, modules: dict[str, Any] | None = None):
        self.release = release
        self.root = Path(root)
        self.dims: list[str] = list(release["dims"])
        self.specs: list[dict[str, Any]] = list(release["inputs"])
        self.truncate: bool = bool(release.get("truncate", False))
        self.convert_dtypes: bool = bool(release.get("convert_dtypes", False))
        bs = [Bucket(b["id"], {d: int(b["sizes"][d]) for d in self.dims}, tuple(b["inputs"]),
                     self.root / b["artifact"], b["loader"]) for b in release["buckets"]]
        self.buckets: list[Bucket] = sorted(bs, key=lambda b: (b.total, tuple(b.sizes[d] for d in self.dims)))
        self._modules: dict[str, Any] = dict(modules or {})
        lead = {spec["shape"][0] if spec["shape"] else None for spec in self.specs}
        #: The bucket dim split into chunks when a batch is larger than every bucket: ``batch`` when it is
        #: a bucket dim leading every input (else None: no chunking).
        self.batch_dim: str | None = "batch" if "batch" in self.dims and lead == {"batch"} else None

    @classmethod
    def load(cls, folder: str | Path) -> BucketedModel:
        """Load a folder written by ``neuron-build pull``: ``release.json`` and every bucket's artifact.

        Raises:
            UserError: no ``release.json``; this host's installed versions cannot load the artifacts (one
                line naming the built and the installed version; the rule per artifact kind is
                :data:`neuron_build.artifact.LOAD_RULES`); or a listed file is missing or has another size
                than listed.
        """
        root = Path(folder)
        try:
            release = json.loads((root / "release.json").read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{root / 'release.json'}: cannot read it ({e}); pull a release into {root} with "
                            f"`neuron-build pull MODEL --channel C --dest {root}`") from None
        problem = release_version_problem(
            release.get("backend", ""), release.get("toolchain") or {},
            [(b.get("loader", ""), b.get("artifact", "")) for b in release["buckets"]],
            f"{root / 'release.json'} (release {release.get('release')} of {release.get('model')})")
        if problem:
            raise UserError(problem)
        for b in release["buckets"]:
            for name, ent in b["files"].items():
                p = root / name
                if not p.is_file() or p.stat().st_size != ent["size"]:
                    raise UserError(f"{p}: missing or not {ent['size']} bytes as release.json lists; pull again")
        model = cls(release, root)
        for b in model.buckets:
            model._modules[b.id] = load_artifact(b.artifact, b.loader, release.get("backend", ""))
        return model

    # -- routing --------------------------------------------------------------------------------
    def _sizes(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        if len(shapes) != len(self.specs):
            raise BucketError(f"{self.release['model']} takes {len(self.specs)} input(s) "
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
        other dims (the last chunk holds the rest)."""
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
        cut = {d: self._cut(d, n) for d, n in want.items()}
        for b in self.buckets:
            if all(b.sizes[d] >= n for d, n in cut.items()):
                return b, cut
        model = self.release["model"]
        req = ", ".join(f"{d}={n}" for d, n in request.items())
        over = [d for d, n in cut.items() if n > max(b.sizes[d] for b in self.buckets)]
        fix = "; ".join(f"add a bucket with {d} >= {cut[d]} to [models.{model}] buckets in buckets.toml"
                        for d in over) or f"add a bucket that fits {req} to [models.{model}] buckets"
        trunc = [d for d in over if d != self.batch_dim]
        hint = (f"; or set truncate = true under [models.{model}] to cut {', '.join(trunc)} to the largest bucket "
                f"(drops the rest)" if trunc and not self.truncate else "")
        raise BucketError(f"inputs of {req} are larger than every bucket of {model} ({self.release['release']}): "
                          f"{', '.join(b.describe() for b in self.buckets)}. Fix: {fix}, then build, release, "
                          f"promote and pull again{hint} (serving options are read from the pulled release.json)")

    def choose(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> str:
        """The id of the bucket inputs of these shapes are routed to (e.g. ``b8-s64``)."""
        return self.route(shapes)[0].id

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *inputs):
        """Run the model on ``inputs`` (tensors, in input order): route, pad, run, slice back; a batch
        larger than every bucket runs in chunks whose outputs are concatenated along the batch dim.

        Returns:
            The artifact's outputs (a tensor, or a tuple/list of them) sliced to the request's sizes.

        Raises:
            BucketError: see :meth:`route`; or an input's dtype differs from the artifact's and
                ``convert_dtypes`` is off.
        """
        want = self._sizes([tuple(t.shape) for t in inputs])
        sizes = self.chunks(want) if self.batch_dim else []
        if len(sizes) <= 1:
            bucket, cut = self._route_sizes(want, want)
            return self._run(bucket, cut, inputs)
        outs, start = [], 0
        for n in sizes:
            part = tuple(t[start:start + n] for t in inputs)
            bucket, cut = self._route_sizes({**want, self.batch_dim: n}, want)
            outs.append((n, self._run(bucket, cut, part)))
            start += n
        return self._join(outs)

    def _join(self, outs: list[tuple[int, Any]]):
        import torch

        first = outs[0][1]
        if isinstance(first, (tuple, list)):
            return type(first)(self._join([(n, o[i]) for n, o in outs]) for i in range(len(first)))
        if isinstance(first, torch.Tensor) and all(isinstance(o, torch.Tensor) and o.dim() > 0 and o.shape[0] == n
                                                   for n, o in outs):
            return torch.cat([o for _, o in outs], dim=0)
        return first

    def _run(self, bucket: Bucket, sizes: dict[str, int], inputs: Sequence[Any]):
        import torch

        padded = []
        for spec, binp, t in zip(self.specs, bucket.inputs, inputs, strict=True):
            want = torch_dtype(binp["dtype"])
            if t.dtype != want:
                if not self.convert_dtypes:
                    raise BucketError(f"input '{spec['name']}' is {t.dtype}; release {self.release['release']} "
                                      f"expects {want} ({binp['dtype']}); convert it, or set convert_dtypes = "
                                      f"true under [models.{self.release['model']}]")
                t = t.to(want)
            t = t[tuple(slice(0, sizes[d]) if isinstance(d, str) else slice(None) for d in spec["shape"])]
            shape = tuple(binp["shape"])
            if tuple(t.shape) != shape:
                full = torch.full(shape, spec.get("pad", 0), dtype=want, device=t.device)
                full[tuple(slice(0, n) for n in t.shape)] = t
                t = full
            padded.append(t.contiguous())
        with torch.no_grad():
            out = self._modules[bucket.id](*padded)
        return self._slice(out, bucket, sizes)

    def _slice(self, out, bucket: Bucket, sizes: dict[str, int]):
        import torch

        if isinstance(out, (tuple, list)):
            return type(out)(self._slice(o, bucket, sizes) for o in out)
        if not isinstance(out, torch.Tensor):
            return out
        best: tuple[int, list[Any]] | None = None
        for spec, binp in zip(self.specs, bucket.inputs, strict=True):
            sym, shape = spec["shape"], binp["shape"]
            k = 0
            while k < min(out.dim(), len(shape)) and out.shape[k] == shape[k]:
                k += 1
            if k and any(isinstance(d, str) for d in sym[:k]) and (best is None or k > best[0]):
                best = (k, sym[:k])
        if best is None:
            return out
        return out[tuple(slice(0, sizes[d]) if isinstance(d, str) else slice(None) for d in best[1])]


__all__ = ["Bucket", "BucketError", "BucketedModel"]
