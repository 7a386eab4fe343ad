"""Serving traffic: what a serving process was asked, counted per shape and per bucket, written as JSON lines.

:class:`TrafficRecorder` is what :class:`neuron_build.runtime.BucketedModel` fills on every call (and what a
text-generation path calls for each prompt's prefill): one count per distinct request shape (its sizes per
bucket dim, e.g. ``batch=3, seq=40``) and chosen bucket, with the padding those calls cost, and totals per
bucket. Memory is bounded: at most ``max_shapes`` distinct (shape, bucket) entries are kept; a call of a
new shape once the table is full is counted in ``overflow_calls`` (and in its bucket's totals), not stored.

Padding is counted in elements of the bucket-dim grid: a request of sizes ``v`` run in a bucket of sizes
``b`` costs ``prod(b) - prod(v)`` padded positions (per chunk, when a batch is split), against ``prod(v)``
real ones. The padding ratio is padded / real.

A traffic file (``save``) is JSON lines, each an object with a ``kind``:

- ``{"kind": "traffic", "schema": "neuron-build/traffic/v1", "model", "release", "dims", "started",
  "saved", "calls", "unserved", "truncated", "overflow_calls", "max_shapes"}`` first;
- ``{"kind": "bucket", "bucket", "sizes", "calls", "elements", "padded"}`` per bucket that ran;
- ``{"kind": "shape", "sizes", "bucket", "count", "padded"}`` per distinct shape (``bucket`` null: no
  bucket could serve it).

Files merge by summing (:func:`load_traffic`): one file per replica and per day, any number of them.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.util import utc_now, write_atomic

#: The ``schema`` of a traffic file's first line.
TRAFFIC_SCHEMA = "neuron-build/traffic/v1"
#: Distinct (shape, bucket) entries a recorder keeps by default (about 200 bytes each).
DEFAULT_MAX_SHAPES = 10_000


def _key(dims: Sequence[str], sizes: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((d, int(sizes[d])) for d in dims if d in sizes)


class TrafficRecorder:
    """Counts of a serving process's calls per request shape and bucket (thread-safe, bounded).

    Args:
        model: the model name (the release's ``model``).
        release: the release id being served.
        dims: the bucket dim names, in the release's order.
        max_shapes: the most distinct (shape, bucket) entries kept; further new shapes are counted in
            ``overflow_calls`` only.
        metrics: a ``prometheus_client.CollectorRegistry`` to register serving metrics on (none by
            default: nothing is registered anywhere): ``neuron_build_serving_calls_total{model,bucket}``,
            ``neuron_build_serving_elements_total{model,bucket,kind=real|padding}``,
            ``neuron_build_serving_padding_ratio{model,bucket}`` (padded / real since the start) and
            ``neuron_build_serving_unserved_total{model}`` (requests no bucket could serve).
    """

    def __init__(self, model: str, release: str | None, dims: Sequence[str], *,
                 max_shapes: int = DEFAULT_MAX_SHAPES, metrics: Any = None):
        if max_shapes < 0:
            raise ValueError(f"max_shapes is {max_shapes}; give 0 or more")
        self.model = model
        self.release = release
        self.dims = list(dims)
        self.max_shapes = int(max_shapes)
        self._lock = threading.Lock()
        self._metrics = _Metrics(metrics, model) if metrics is not None else None
        self.reset()

    def reset(self) -> None:
        """Forget every count (a new ``started`` time)."""
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        self.started = utc_now()
        self.calls = self.unserved = self.truncated = self.overflow_calls = 0
        #: (shape key, bucket id or None) -> [count, padded elements]
        self.shapes: dict[tuple[tuple[tuple[str, int], ...], str | None], list[int]] = {}
        #: bucket id -> {"sizes", "calls", "elements", "padded"}
        self.buckets: dict[str, dict[str, Any]] = {}

    def record(self, sizes: Mapping[str, int], bucket: str | None,
               runs: Sequence[tuple[str, Mapping[str, int], Mapping[str, int]]] = (), *,
               truncated: bool = False) -> None:
        """Count one request.

        Args:
            sizes: the request's size per bucket dim, as asked (before truncation or chunking), e.g.
                ``{"batch": 3, "seq": 40}``; a text-generation prefill passes its prompt's
                (``{"batch": 1, "seq": 37}``).
            bucket: the id of the bucket it ran in (the first chunk's when split), None when no bucket
                could serve it.
            runs: one ``(bucket id, bucket sizes, run sizes)`` per bucket call it took (one, or one per
                chunk; run sizes after truncation); their padding is summed. Empty for an unserved request.
            truncated: a sequence dim was cut to the largest bucket.
        """
        key = (_key(self.dims, sizes), bucket)
        padded_total = 0
        per_run = []
        for bid, bsizes, rsizes in runs:
            real = math.prod(int(rsizes[d]) for d in bsizes)
            padded = math.prod(int(n) for n in bsizes.values()) - real
            per_run.append((bid, bsizes, real, padded))
            padded_total += padded
        with self._lock:
            self.calls += 1
            if bucket is None:
                self.unserved += 1
            if truncated:
                self.truncated += 1
            ent = self.shapes.get(key)
            if ent is None and len(self.shapes) < self.max_shapes:
                ent = self.shapes[key] = [0, 0]
            if ent is None:
                self.overflow_calls += 1
            else:
                ent[0] += 1
                ent[1] += padded_total
            for bid, bsizes, real, padded in per_run:
                b = self.buckets.get(bid)
                if b is None:
                    b = self.buckets[bid] = {"sizes": {d: int(n) for d, n in bsizes.items()}, "calls": 0,
                                             "elements": 0, "padded": 0}
                b["calls"] += 1
                b["elements"] += real
                b["padded"] += padded
        if self._metrics is not None:
            self._metrics.observe(per_run, bucket is None)

    def snapshot(self) -> dict[str, Any]:
        """The counts as plain data: the header fields of a traffic file, ``buckets`` (id -> ``sizes``,
        ``calls``, ``elements``, ``padded``, ``padding_ratio``) and ``shapes`` (``sizes``, ``bucket``,
        ``count``, ``padded``), most frequent first."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        shapes = [{"sizes": dict(k), "bucket": b, "count": c, "padded": p} for (k, b), (c, p) in self.shapes.items()]
        buckets = {bid: {**b, "sizes": dict(b["sizes"]),
                         "padding_ratio": b["padded"] / b["elements"] if b["elements"] else 0.0}
                   for bid, b in self.buckets.items()}
        head = {"schema": TRAFFIC_SCHEMA, "model": self.model, "release": self.release, "dims": list(self.dims),
                "started": self.started, "saved": utc_now(), "calls": self.calls, "unserved": self.unserved,
                "truncated": self.truncated, "overflow_calls": self.overflow_calls, "max_shapes": self.max_shapes}
        shapes.sort(key=lambda s: (-s["count"], sorted(s["sizes"].items()), s["bucket"] or ""))
        return {**head, "buckets": buckets, "shapes": shapes}

    def save(self, path: str | Path, *, reset: bool = False) -> Path:
        """Write the counts to ``path`` as JSON lines (atomically: a reader never sees half a file).

        Args:
            reset: forget the counts once written, so the next file holds only what came after (one file
                per day or hour then sums to the whole with :func:`load_traffic`). Calls that arrive while
                the file is written are kept for the next file.

        Returns:
            The path written.
        """
        with self._lock:  # one snapshot and the reset happen together: no call is counted twice or lost
            snap = self._snapshot()
            if reset:
                self._reset()
        lines = [json.dumps({"kind": "traffic", **{k: v for k, v in snap.items() if k not in ("buckets", "shapes")}})]
        lines += [json.dumps({"kind": "bucket", "bucket": bid, "sizes": b["sizes"], "calls": b["calls"],
                              "elements": b["elements"], "padded": b["padded"]}) for bid, b in snap["buckets"].items()]
        lines += [json.dumps({"kind": "shape", **s}) for s in snap["shapes"]]
        p = Path(path)
        write_atomic(p, ("\n".join(lines) + "\n").encode())
        return p


class _Metrics:
    """The Prometheus series of one recorder, registered on the caller's registry only."""

    def __init__(self, registry: Any, model: str):
        from prometheus_client import Counter, Gauge

        self.model = model
        self.calls = Counter("neuron_build_serving_calls", "bucket calls of the served model",
                             ["model", "bucket"], registry=registry)
        self.elements = Counter("neuron_build_serving_elements", "bucket-dim positions run: real or padding",
                                ["model", "bucket", "kind"], registry=registry)
        self.ratio = Gauge("neuron_build_serving_padding_ratio", "padded / real positions per bucket since start",
                           ["model", "bucket"], registry=registry)
        self.unserved = Counter("neuron_build_serving_unserved", "requests no bucket could serve",
                                ["model"], registry=registry)
        self._sums: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def observe(self, runs: list[tuple[str, Mapping[str, int], int, int]], unserved: bool) -> None:
        if unserved:
            self.unserved.labels(self.model).inc()
        for bid, _sizes, real, padded in runs:
            self.calls.labels(self.model, bid).inc()
            self.elements.labels(self.model, bid, "real").inc(real)
            self.elements.labels(self.model, bid, "padding").inc(padded)
            with self._lock:
                s = self._sums.setdefault(bid, [0, 0])
                s[0] += real
                s[1] += padded
                self.ratio.labels(self.model, bid).set(s[1] / s[0] if s[0] else 0.0)


# -- reading and merging ---------------------------------------------------------------------------------
@dataclass
class ModelTraffic:
    """The summed traffic of one model over any number of files.

    ``shapes``: (shape key ``((dim, size), ...)``, bucket id or None) -> [count, padded];
    ``buckets``: (bucket id, sizes key) -> [calls, elements, padded]; ``files``: the files read.
    """

    model: str
    dims: list[str] = field(default_factory=list)
    releases: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    calls: int = 0
    unserved: int = 0
    truncated: int = 0
    overflow_calls: int = 0
    shapes: dict[tuple[tuple[tuple[str, int], ...], str | None], list[int]] = field(default_factory=dict)
    buckets: dict[tuple[str, tuple[tuple[str, int], ...]], list[int]] = field(default_factory=dict)

    def add(self, other: ModelTraffic) -> None:
        """Sum ``other`` (the same model's traffic from other files) into this."""
        self.dims += [d for d in other.dims if d not in self.dims]
        self.releases += [r for r in other.releases if r not in self.releases]
        self.files += other.files
        for k in ("calls", "unserved", "truncated", "overflow_calls"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for key, ent in other.shapes.items():
            mine = self.shapes.setdefault(key, [0, 0])
            mine[0] += ent[0]
            mine[1] += ent[1]
        for key, ent in other.buckets.items():
            mine = self.buckets.setdefault(key, [0, 0, 0])
            for i in range(3):
                mine[i] += ent[i]

    def counts(self, dims: Sequence[str]) -> dict[tuple[int, ...], int]:
        """Requests per value tuple of ``dims`` (the other dims summed out), from the stored shapes.

        Raises:
            KeyError: a shape lacks one of ``dims``.
        """
        out: dict[tuple[int, ...], int] = {}
        for (key, _b), (c, _p) in self.shapes.items():
            sz = dict(key)
            v = tuple(sz[d] for d in dims)
            out[v] = out.get(v, 0) + c
        return out

    def bucket_rows(self) -> list[dict[str, Any]]:
        """One row per bucket that ran: ``bucket``, ``sizes``, ``calls``, ``elements``, ``padded``,
        ``padding_ratio``, in order of the bucket's total size."""
        rows = [{"bucket": bid, "sizes": dict(sk), "calls": c, "elements": e, "padded": p,
                 "padding_ratio": p / e if e else 0.0} for (bid, sk), (c, e, p) in self.buckets.items()]
        rows.sort(key=lambda r: (math.prod(r["sizes"].values()), tuple(r["sizes"].values()), r["bucket"]))
        return rows


def _fail(path: str, line: int, what: str) -> UserError:
    return UserError(f"{path}:{line}: {what}; a traffic file is what BucketedModel.save_traffic writes "
                     f"(JSON lines, first line kind \"traffic\")")


def _int(v: Any, path: str, line: int, name: str, low: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _fail(path, line, f"'{name}' is {v!r}, not an integer >= {low}")
    return v


def _sizes(v: Any, path: str, line: int, name: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise _fail(path, line, f"'{name}' is {v!r}, not an object of dim -> size")
    return tuple((k, _int(n, path, line, f"{name}.{k}", 1)) for k, n in v.items())


def read_traffic_file(path: str | Path, into: dict[str, ModelTraffic] | None = None) -> dict[str, ModelTraffic]:
    """Read one traffic file and add its counts to ``into`` (model -> :class:`ModelTraffic`).

    Raises:
        UserError: the file is missing or unreadable, or a line is not JSON, not a known ``kind``, or has a
            field of the wrong type; the message names the file and line.
    """
    into = {} if into is None else into
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{shown}: cannot read the traffic file ({getattr(e, 'strerror', None) or e}); give a file "
                        f"BucketedModel.save_traffic wrote") from None
    mt: ModelTraffic | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise _fail(shown, n, f"not JSON ({e})") from None
        if not isinstance(rec, dict):
            raise _fail(shown, n, "not a JSON object")
        kind = rec.get("kind")
        if mt is None:
            if kind != "traffic":
                raise _fail(shown, n, f"the first line has kind {kind!r}, not \"traffic\"")
            if rec.get("schema") != TRAFFIC_SCHEMA:
                raise _fail(shown, n, f"schema {rec.get('schema')!r}; this neuron-build reads {TRAFFIC_SCHEMA}")
            model = rec.get("model")
            dims = rec.get("dims")
            if not isinstance(model, str) or not model:
                raise _fail(shown, n, f"'model' is {model!r}, not a model name")
            if not isinstance(dims, list) or not all(isinstance(d, str) for d in dims):
                raise _fail(shown, n, f"'dims' is {dims!r}, not a list of dim names")
            mt = into.setdefault(model, ModelTraffic(model))
            for d in dims:
                if d not in mt.dims:
                    mt.dims.append(d)
            rel = rec.get("release")
            if isinstance(rel, str) and rel not in mt.releases:
                mt.releases.append(rel)
            mt.files.append(shown)
            for k in ("calls", "unserved", "truncated", "overflow_calls"):
                setattr(mt, k, getattr(mt, k) + _int(rec.get(k, 0), shown, n, k))
        elif kind == "bucket":
            bid = rec.get("bucket")
            if not isinstance(bid, str):
                raise _fail(shown, n, f"'bucket' is {bid!r}, not a bucket id")
            key = (bid, _sizes(rec.get("sizes"), shown, n, "sizes"))
            ent = mt.buckets.setdefault(key, [0, 0, 0])
            for i, k in enumerate(("calls", "elements", "padded")):
                ent[i] += _int(rec.get(k), shown, n, k)
        elif kind == "shape":
            bid = rec.get("bucket")
            if bid is not None and not isinstance(bid, str):
                raise _fail(shown, n, f"'bucket' is {bid!r}, not a bucket id or null")
            key = (_sizes(rec.get("sizes"), shown, n, "sizes"), bid)
            ent = mt.shapes.setdefault(key, [0, 0])
            ent[0] += _int(rec.get("count"), shown, n, "count")
            ent[1] += _int(rec.get("padded", 0), shown, n, "padded")
        else:
            raise _fail(shown, n, f"unknown kind {kind!r} (expected traffic, bucket or shape)")
    if mt is None:
        raise UserError(f"{shown}: empty traffic file; give a file BucketedModel.save_traffic wrote")
    return into


def load_traffic(paths: Iterable[str | Path]) -> dict[str, ModelTraffic]:
    """Read and sum traffic files (any number, of any replicas and days): model -> :class:`ModelTraffic`.

    Raises:
        UserError: see :func:`read_traffic_file`; or no path was given.
    """
    into: dict[str, ModelTraffic] = {}
    paths = list(paths)
    if not paths:
        raise UserError("no traffic file given; pass --traffic FILE (written by BucketedModel.save_traffic)")
    for p in paths:
        read_traffic_file(p, into)
    return into


def model_traffic(model: str, files: Sequence[str | Path], dims: Sequence[str]) -> ModelTraffic:
    """The traffic of ``model`` summed over ``files`` (what :meth:`TrafficRecorder.save` writes), each file
    checked to hold only that model's traffic, with every request sized along each of ``dims``.

    Raises:
        UserError: a file is unreadable or malformed, holds another model's traffic, or its requests lack
            one of ``dims`` (one line naming the file and the fix).
        ValueError: ``files`` is empty.
    """
    total = None
    for f in files:
        got = read_traffic_file(f)
        other = [m for m in got if m != model]
        if other:
            raise UserError(f"{f}: holds traffic of model '{other[0]}', not '{model}'; pass only {model}'s "
                            f"traffic files")
        mt = got[model]
        for key, _b in mt.shapes:
            have = [d for d, _n in key]
            missing = [d for d in dims if d not in have]
            if missing:
                raise UserError(f"{f}: its requests have dims {have}, not '{missing[0]}'; the release it served "
                                f"had other bucket dims than buckets.toml now (give --dim of {', '.join(have)})")
        if total is None:
            total = mt
        else:
            total.add(mt)
    if total is None:
        raise ValueError("no traffic file given")
    return total


__all__ = ["DEFAULT_MAX_SHAPES", "TRAFFIC_SCHEMA", "ModelTraffic", "TrafficRecorder", "load_traffic", "model_traffic",
           "read_traffic_file"]
