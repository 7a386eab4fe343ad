"""Expansion of the matrix into targets: models x buckets x dtypes x profiles.

A target id reads ``<model>/<bucket id>/<dtype>/<profile>`` (``minilm/b8-s128/bf16/o2``). The backend and
hardware target are build-wide settings: they are part of every key, not of the id, so switching backend
keeps the ids and changes the keys.

A text-generation model (``task = "text-generation"``) has two graphs: one **prefill** target per prefill
bucket (``llama/prefill-b1-s16/fp32/p1``) and one **decode** target per batch size
(``llama/decode-b1/fp32/p1``, one token against the whole KV cache). The graph leads the bucket id, so ids
keep their four parts (the store's per-target folders, the ledger, failures and release folders read them
so); :attr:`Target.graph` is ``prefill`` or ``decode`` there, ``forward`` for every other model. On the
neuron backend NxDI compiles all graphs of a batch size at once: one ``nxdi`` target per batch size
(``llama/nxdi-b1/bf16/p1``).
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from neuron_build.backends import find_backend
from neuron_build.errors import UserError
from neuron_build.project.config import ModelSpec, Project

#: The graphs of a text-generation model, in build order.
TEXTGEN_GRAPHS = ("prefill", "decode")
#: Token ids in the example inputs of a text-generation graph are drawn from ``[0, 2)``: valid for any
#: vocabulary (values never change a compiled graph; shapes and dtypes do).
TOKEN_RANGE = (0.0, 2.0)


@dataclass(frozen=True)
class ConcreteInput:
    """An input with its shape made concrete for one bucket.

    ``shape`` is a tuple of positive ints; ``dtype`` one of the input dtypes of
    :mod:`neuron_build.project.config`; ``range`` is ``[low, high)`` or None (float inputs: standard normal).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    range: tuple[float, float] | None

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "range": list(self.range) if self.range is not None else None}


@dataclass(frozen=True)
class Target:
    """One unit of build: (model, bucket, dtype, profile); backend and hardware target come from [build]."""

    model: str
    bucket: tuple[tuple[str, int], ...]
    dtype: str
    profile: str
    #: ``""`` for a model's only forward; ``prefill`` or ``decode`` for a text-generation model.
    graph: str = ""

    @cached_property
    def bucket_id(self) -> str:
        """The bucket's id (``b8-s512``; ``prefill-b1-s16``, ``decode-b1`` for a text-generation graph),
        computed once."""
        bid = bucket_id(self.bucket)
        return f"{self.graph}-{bid}" if self.graph else bid

    @property
    def graph_name(self) -> str:
        """The graph this target compiles: ``forward``, ``prefill`` or ``decode``."""
        return self.graph or "forward"

    @cached_property
    def id(self) -> str:
        """``model/bucket id/dtype/profile``, computed once (read many times on the no-op path)."""
        return f"{self.model}/{self.bucket_id}/{self.dtype}/{self.profile}"

    def inputs(self, spec: ModelSpec) -> tuple[ConcreteInput, ...]:
        """The model's inputs with this bucket's sizes and this target's dtype filled in. A text-generation
        graph takes ``input_ids`` (int64 ``[batch, seq]``; ``[batch, 1]`` for decode) and ``cache_position``
        (int64 ``[seq]``; ``[1]``), the KV cache being state shared by the graphs of one batch size."""
        sizes = dict(self.bucket)
        if self.graph == "nxdi":
            return (ConcreteInput("input_ids", (sizes["batch"], max(spec.buckets.get("seq", (1,)))), "int64",
                                  TOKEN_RANGE),)
        if self.graph:
            n = sizes.get("seq", 1)
            return (ConcreteInput("input_ids", (sizes["batch"], n), "int64", TOKEN_RANGE),
                    ConcreteInput("cache_position", (n,), "int64", (0.0, float(spec.max_seq_len or n))))
        return tuple(
            ConcreteInput(name=i.name, shape=tuple(sizes[d] if isinstance(d, str) else d for d in i.shape),
                          dtype=i.dtype or self.dtype, range=i.range)
            for i in spec.inputs)


def bucket_id(bucket: Iterable[tuple[str, int]]) -> str:
    """``(("batch", 8), ("seq", 512))`` -> ``b8-s512``: each dim's first letter, or its whole name when
    two dims of the model share a first letter; ``static`` for a model without bucket dims."""
    bucket = tuple(bucket)
    if not bucket:
        return "static"
    firsts = [d[0] for d, _ in bucket]
    return "-".join(f"{d[0] if firsts.count(d[0]) == 1 else d}{v}" for d, v in bucket)


def expand(project: Project) -> list[Target]:
    """All targets of the matrix, in config order (model, dtype, profile, then buckets in value order)."""
    out: list[Target] = []
    for name, m in project.config.models.items():
        if m.is_textgen:
            spec = find_backend(project.config.build.backend)  # (auto: the per-graph targets)
            out.extend(textgen_targets(name, m, nxdi=spec is not None and spec.textgen_per_batch))
            continue
        dims = list(m.buckets)
        combos = list(itertools.product(*(m.buckets[d] for d in dims)))
        for dtype in m.dtypes:
            for profile in m.profiles:
                for values in combos:
                    out.append(Target(name, tuple(zip(dims, values, strict=True)), dtype, profile))
    return out


def textgen_targets(name: str, m: ModelSpec, nxdi: bool = False) -> list[Target]:
    """The targets of a text-generation model: per dtype and profile, a prefill target per (batch, seq)
    bucket, then a decode target per batch size. With ``nxdi`` (backend neuron), one ``nxdi`` target per
    batch size (``llama/nxdi-b1/bf16/p1``): NxDI compiles every prefill and decode bucket of it at once."""
    out = []
    batches, seqs = m.buckets.get("batch", (1,)), m.buckets.get("seq", ())
    for dtype in m.dtypes:
        for profile in m.profiles:
            if nxdi:
                out.extend(Target(name, (("batch", b),), dtype, profile, "nxdi") for b in batches)
                continue
            for b in batches:
                for s in seqs:
                    out.append(Target(name, (("batch", b), ("seq", s)), dtype, profile, "prefill"))
            for b in batches:
                out.append(Target(name, (("batch", b),), dtype, profile, "decode"))
    return out


def select(targets: list[Target], patterns: Iterable[str]) -> list[Target]:
    """Targets whose id matches any of the glob patterns (``minilm/*``, ``*/bf16/*``) or equals a model name.

    Raises:
        UserError: a pattern matches nothing; the message lists some target ids.
    """
    patterns = list(patterns)
    if not patterns:
        return targets
    chosen: list[Target] = []
    for p in patterns:
        hit = [t for t in targets if fnmatch.fnmatchcase(t.id, p) or t.model == p or t.id.startswith(p.rstrip("/") + "/")]
        if not hit:
            names = sorted({t.model for t in targets}) + [t.id for t in targets]
            close = difflib.get_close_matches(p, names, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            some = ", ".join(t.id for t in targets[:3])
            raise UserError(f"no target matches '{p}'; {hint}targets look like: {some} (see `neuron-build plan`)")
        chosen.extend(t for t in hit if t not in chosen)
    return chosen


__all__ = ["TEXTGEN_GRAPHS", "TOKEN_RANGE", "ConcreteInput", "Target", "bucket_id", "expand", "select",
           "textgen_targets"]
