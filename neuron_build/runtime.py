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
3. **Too large.** A request larger than every bucket along some dim is an error naming the buckets,
   unless the model's config says ``truncate = true``: then each such dim is cut to the largest size any
   bucket has (the leading part is kept), and the outputs have the cut size.
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
        after truncation).

        Args:
            shapes: one shape per input, in input order, or a mapping input name -> shape.

        Raises:
            BucketError: a shape does not match the inputs, or is larger than every bucket and
                truncation is off.
        """
        if isinstance(shapes, Mapping):
            missing = [s["name"] for s in self.specs if s["name"] not in shapes]
            if missing:
                raise BucketError(f"no shape given for input(s) {', '.join(missing)}")
            shapes = [shapes[s["name"]] for s in self.specs]
        want = self._sizes(list(shapes))
        for b in self.buckets:
            if all(b.sizes[d] >= n for d, n in want.items()):
                return b, want
        if self.truncate:
            cut = {d: min(n, max(b.sizes[d] for b in self.buckets)) for d, n in want.items()}
            for b in self.buckets:
                if all(b.sizes[d] >= n for d, n in cut.items()):
                    return b, cut
        req = ", ".join(f"{d}={n}" for d, n in want.items())
        raise BucketError(f"inputs of {req} are larger than every bucket of {self.release['model']} "
                          f"({self.release['release']}): {', '.join(b.describe() for b in self.buckets)}"
                          + ("" if self.truncate else
                             f"; set truncate = true under [models.{self.release['model']}] to cut them to the "
                             f"largest bucket"))

    def choose(self, shapes: Sequence[Sequence[int]] | Mapping[str, Sequence[int]]) -> str:
        """The id of the bucket inputs of these shapes are routed to (e.g. ``b8-s64``)."""
        return self.route(shapes)[0].id

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *inputs):
        """Run the model on ``inputs`` (tensors, in input order): route, pad, run, slice back.

        Returns:
            The artifact's outputs (a tensor, or a tuple/list of them) sliced to the request's sizes.

        Raises:
            BucketError: see :meth:`route`; or an input's dtype differs from the artifact's and
                ``convert_dtypes`` is off.
        """
        import torch

        bucket, sizes = self.route([tuple(t.shape) for t in inputs])
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
