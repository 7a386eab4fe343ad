"""How long a compile will take and how much host memory it will need, predicted from the build ledger.

Torch-free and store-only: the predictor reads :mod:`neuron_build.store.ledger` records (each compile's wall
time ``compile_time_s`` and the peak resident memory of its process tree ``peak_rss_bytes``) and answers, per
target, in this order (the first level with a record wins; ``source`` says which):

1. ``key``: earlier compiles of the same key;
2. ``target``: the same target id (model, bucket, dtype, profile) under another key (another toolchain, an
   edited model), as recorded;
3. ``bucket``: the same model and bucket under another dtype, profile or backend, scaled by the median ratio
   of the two variants over the buckets where both were compiled (1 when none overlap);
4. ``model``: the same model's other buckets (recorded, or seen finishing in this build through
   :meth:`Predictor.observe`, e.g. its priority graph): the prior below scaled by the median ratio of their
   recorded values to the prior's (the mean log ratio, shrunk toward the prior by how many buckets back it:
   empirical Bayes with the within-model and between-model spreads of the ledger), so a never-built model is
   sized by its own first compiles; its p90 adds the within-model spread and the ratio's own uncertainty;
5. ``prior``: a log-linear fit ``log t = a + b log(size) + c log(tokens)`` over every recorded bucket
   (``tokens``: the product of the bucket's sizes, e.g. 8 x 512 for ``b8-s512``; ``size``: a model-size figure
   the caller gives, e.g. parameters, when it has one), falling back to the model's own buckets, then to the
   median of every compile;
6. ``none``: nothing recorded at all (``seconds`` is None; the memory is the configured default).

Times are the p50 (median) of the chosen records, for ordering and ETAs; memory is their p90 (of fewer than
:data:`FEW` records, their largest times :data:`MEMORY_MARGIN`; for the prior, the fit plus 1.28 residual
standard deviations), for reservations. A failed compile's time and peak count too: a compile killed for
memory at 40 GB needed at least that. Facts about compile times: ``../shared/compile-fleet.md`` §1, §3
(Buildbarn size classes, BuildBuddy's "last measured" sizing); the predictor is only a lookup plus a prior.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neuron_build.util import percentile

if TYPE_CHECKING:
    from neuron_build.project.matrix import Target
    from neuron_build.workspace import Workspace

#: The levels a prediction may come from, strongest first (see the module docstring).
SOURCES = ("key", "target", "bucket", "model", "prior", "none")
#: Fewer records than this and the p90 is not read off them: the largest, times a margin ([guess]: a
#: compile's peak moves by about 10 % between toolchains; its time by far more).
FEW = 5
MEMORY_MARGIN = 1.2
TIME_MARGIN = 1.5
#: z of the 90th percentile of a normal distribution (the prior's residuals are taken as log-normal).
Z90 = 1.2816
_NUM = re.compile(r"[a-z]+(\d+)")


@dataclass(frozen=True)
class Prediction:
    """A predicted compile.

    Attributes:
        seconds: p50 compile wall time, seconds (None when nothing was ever recorded).
        seconds_p90: p90 compile wall time, seconds (None likewise): for "will it finish before the worker's
            lifetime ends".
        peak_bytes: p90 peak resident memory of the compile's process tree, bytes.
        source: one of :data:`SOURCES`.
        peak_p50_bytes: p50 of that peak, bytes (the dispatcher sums p50s and their spread per worker).
    """

    seconds: float | None
    seconds_p90: float | None
    peak_bytes: int
    source: str
    peak_p50_bytes: int | None = None


def bucket_tokens(bucket_id: str) -> int:
    """The product of the sizes in a bucket id (``b8-s512`` -> 4096; ``decode-b4`` -> 4; ``prefill-b1-s16`` ->
    16); 1 when it has none."""
    n = 1
    for part in bucket_id.split("-"):
        m = _NUM.fullmatch(part)
        if m:
            n *= max(int(m.group(1)), 1)
    return n


def _split(target_id: str) -> tuple[str, str, str]:
    """(model, bucket id, variant ``dtype/profile``) of a target id (``model/bucket/dtype/profile``)."""
    parts = target_id.split("/")
    if len(parts) != 4:
        return target_id, "", ""
    return parts[0], parts[1], f"{parts[2]}/{parts[3]}"


def _median(xs: Sequence[float]) -> float:
    return percentile(xs, 50)


class Predictor:
    """Predicts each target's compile time (p50, p90) and peak memory (p90) from ledger records.

    Args:
        records: :class:`~neuron_build.store.ledger.LedgerRecord` objects (any order; only ``compile``
            events with a positive ``compile_time_s`` or ``peak_rss_bytes`` are used, passed or failed).
        default_peak_bytes: the memory predicted when nothing is known ([build] default_compile_memory_gb).
        sizes: model name -> a model-size figure (e.g. parameter count, weight bytes) for the prior; optional.
    """

    def __init__(self, records: Iterable, default_peak_bytes: int, sizes: Mapping[str, float] | None = None):
        self.default_peak_bytes = int(default_peak_bytes)
        self.sizes = dict(sizes or {})
        self._by_key: dict[str, list[tuple[float | None, int | None]]] = defaultdict(list)
        self._by_target: dict[str, list[tuple[float | None, int | None]]] = defaultdict(list)
        # (model, bucket) -> variant -> samples; the backend is part of the variant
        self._by_bucket: dict[tuple[str, str], dict[str, list[tuple[float | None, int | None]]]] = \
            defaultdict(lambda: defaultdict(list))
        self._buckets_of: dict[str, set[str]] = defaultdict(set)  # model -> its recorded buckets
        for r in records:
            if getattr(r, "event", None) != "compile":
                continue
            t = r.compile_time_s if isinstance(r.compile_time_s, (int, float)) and r.compile_time_s > 0 else None
            m = r.peak_rss_bytes if isinstance(r.peak_rss_bytes, int) and r.peak_rss_bytes > 0 else None
            self._add(r.target, r.key, getattr(r, "backend", ""), t, m)
        self._ratios: dict[tuple[str, str], tuple[float, float]] = {}
        self._fit = self._fit_prior()
        self._model_ratio: dict[str, tuple[float | None, float | None]] = {}
        self._spreads = self._model_spreads()

    def _add(self, target_id: str, key: str, backend: str, t: float | None, m: int | None) -> bool:
        if t is None and m is None:
            return False
        sample = (float(t) if t is not None else None, int(m) if m is not None else None)
        if key:
            self._by_key[key].append(sample)
        self._by_target[target_id].append(sample)
        model, bucket, variant = _split(target_id)
        self._by_bucket[(model, bucket)][f"{variant}/{backend}"].append(sample)
        self._buckets_of[model].add(bucket)
        return True

    def observe(self, target_id: str, key: str = "", backend: str = "", seconds: float | None = None,
                peak_bytes: int | None = None) -> None:
        """Learn from a compile that finished during this build (its wall time in seconds and its peak memory in
        bytes, as its ledger record will say; either may be None, e.g. the time of a compile killed for memory):
        later predictions for the same key, target, bucket and model use it. The prior's fit is not refitted."""
        t = float(seconds) if isinstance(seconds, (int, float)) and seconds > 0 else None
        m = int(peak_bytes) if isinstance(peak_bytes, (int, float)) and peak_bytes > 0 else None
        if self._add(target_id, key, backend, t, m):
            self._ratios.clear()
            self._model_ratio.pop(_split(target_id)[0], None)

    @classmethod
    def from_store(cls, store, default_peak_bytes: int, sizes: Mapping[str, float] | None = None) -> Predictor:
        """A predictor over every ledger record of ``store`` (:func:`neuron_build.store.ledger.read`)."""
        from neuron_build.store.ledger import read
        return cls(read(store), default_peak_bytes, sizes)

    # -- the levels -------------------------------------------------------------------------------------
    def _ratio(self, mine: str, theirs: str) -> tuple[float, float]:
        """(time, memory) ratio of variant ``mine`` over ``theirs``: the median over buckets holding both."""
        if (mine, theirs) not in self._ratios:
            rt, rm = [], []
            for variants in self._by_bucket.values():
                a, b = variants.get(mine), variants.get(theirs)
                if not a or not b:
                    continue
                ta, tb = [s[0] for s in a if s[0]], [s[0] for s in b if s[0]]
                ma, mb = [s[1] for s in a if s[1]], [s[1] for s in b if s[1]]
                if ta and tb:
                    rt.append(_median(ta) / _median(tb))
                if ma and mb:
                    rm.append(_median(ma) / _median(mb))
            self._ratios[(mine, theirs)] = (_median(rt) if rt else 1.0, _median(rm) if rm else 1.0)
        return self._ratios[(mine, theirs)]

    def _features(self, model: str, bucket: str) -> tuple[float, float] | None:
        size = self.sizes.get(model)
        return (math.log(size) if size and size > 0 else 0.0, math.log(bucket_tokens(bucket)))

    def _fit_prior(self):
        """Least squares of log time on (log size, log tokens) over per-bucket medians, plus the memory
        likewise; None when nothing is recorded. A feature with no spread gets coefficient 0."""
        rows = []
        for (model, bucket), variants in self._by_bucket.items():
            ts = [s[0] for v in variants.values() for s in v if s[0]]
            ms = [s[1] for v in variants.values() for s in v if s[1]]
            x = self._features(model, bucket)
            rows.append((x, math.log(_median(ts)) if ts else None, math.log(_median(ms)) if ms else None))
        if not rows:
            return None
        return _lstsq([(x, y) for x, y, _ in rows if y is not None]), _lstsq([(x, y) for x, _, y in rows if y is not None])

    def _prior(self, model: str, bucket: str) -> tuple[float | None, int | None]:
        if self._fit is None:
            return None, None
        x = self._features(model, bucket)
        ft, fm = self._fit
        t = math.exp(ft[0] + ft[1] * x[0] + ft[2] * x[1]) if ft else None
        m = int(math.exp(fm[0] + fm[1] * x[0] + fm[2] * x[1])) if fm else None
        return t, m

    def _bucket_medians(self, model: str, bucket: str) -> tuple[float | None, float | None]:
        samples = [s for v in self._by_bucket.get((model, bucket), {}).values() for s in v]
        ts, ms = [s[0] for s in samples if s[0]], [s[1] for s in samples if s[1]]
        return (_median(ts) if ts else None), (_median(ms) if ms else None)

    def _log_residuals(self, model: str) -> tuple[list[float], list[float]]:
        """log(recorded / prior) of time and of memory over the model's recorded buckets."""
        rt, rm = [], []
        for bucket in sorted(self._buckets_of.get(model, ())):
            t, m = self._bucket_medians(model, bucket)
            pt, pm = self._prior(model, bucket)
            if t and pt:
                rt.append(math.log(t / pt))
            if m and pm:
                rm.append(math.log(m / pm))
        return rt, rm

    def _ratio_of_model(self, model: str) -> tuple[float | None, float | None]:
        """(time, memory) ratio of the model to the prior: the mean log residual of its recorded buckets, shrunk
        toward 0 by n / (n + s_within^2 / s_between^2) (empirical Bayes: one bucket says less about its model
        than ten); None where nothing is recorded."""
        if model not in self._model_ratio:
            out = []
            for r, (sw, sb) in zip(self._log_residuals(model), self._spreads, strict=True):
                if not r:
                    out.append(None)
                    continue
                shrink = len(r) / (len(r) + sw**2 / sb**2) if sb > 0 else 0.0
                out.append(math.exp(shrink * sum(r) / len(r)))
            self._model_ratio[model] = (out[0], out[1])
        return self._model_ratio[model]

    def _model_spreads(self) -> list[tuple[float, float]]:
        """(within, between) standard deviations of the log residuals, for time and for memory: a bucket's around
        its model's mean (pooled over the models with two or more buckets), and the models' means around the prior
        (their variance less the within part); (prior's sd, 0) where no model has two buckets."""
        out = []
        for j in (0, 1):
            ss, dof, means, shares = 0.0, 0, [], []
            for model in self._buckets_of:
                r = self._log_residuals(model)[j]
                if r:
                    mean = sum(r) / len(r)
                    means.append(mean)
                    shares.append(1 / len(r))
                    ss += sum((x - mean) ** 2 for x in r)
                    dof += len(r) - 1
            fit = self._fit[j] if self._fit else None
            if not dof or not means:
                out.append((fit[3] if fit else 0.0, 0.0))
                continue
            within = math.sqrt(ss / dof)
            between2 = sum(m * m for m in means) / len(means) - within**2 * sum(shares) / len(shares)
            out.append((within, math.sqrt(max(between2, 0.0))))
        return out

    def _from_model(self, model: str, bucket: str) -> Prediction | None:
        """The ``model`` level (see the module docstring), or None when the model has no recorded bucket."""
        if not self._buckets_of.get(model) or self._fit is None:
            return None
        ratios = self._ratio_of_model(model)
        n = self._log_residuals(model)
        pt, pm = self._prior(model, bucket)
        vals = []
        for j, (p, r) in enumerate(zip((pt, pm), ratios, strict=True)):
            fit = self._fit[j]
            if p is None:
                vals.append((None, None))
                continue
            if r is None:  # nothing of this kind recorded for the model: the prior alone
                vals.append((p, p * math.exp(Z90 * fit[3]) if fit else p))
                continue
            sw, sb = self._spreads[j]
            post = 1 / (1 / sb**2 + len(n[j]) / sw**2) if sb > 0 and sw > 0 else 0.0  # the model effect's variance
            vals.append((p * r, p * r * math.exp(Z90 * math.sqrt(sw**2 + post))))
        (t, t90), (m, m90) = vals
        if t is None and m is None:
            return None
        m50 = int(m) if m else self.default_peak_bytes
        return Prediction(t, t90, max(int(m90) if m90 else self.default_peak_bytes, m50), "model", m50)

    def predict(self, target_id: str, key: str | None = None, backend: str = "") -> Prediction:
        """The prediction for target ``target_id`` (``model/bucket/dtype/profile``) whose key is ``key``,
        compiled by ``backend``; never raises."""
        samples = self._by_key.get(key or "") or self._by_target.get(target_id)
        source = "key" if self._by_key.get(key or "") else "target"
        scale = (1.0, 1.0)
        model, bucket, variant = _split(target_id)
        if not samples:
            variants = self._by_bucket.get((model, bucket)) or {}
            mine = f"{variant}/{backend}"
            if variants:
                theirs = max(variants, key=lambda v: (len(variants[v]), v))
                samples, source, scale = variants[theirs], "bucket", self._ratio(mine, theirs)
        if samples:
            ts = [s[0] * scale[0] for s in samples if s[0]]
            ms = [s[1] * scale[1] for s in samples if s[1]]
            pt, pm = self._prior(model, bucket) if not (ts and ms) else (None, None)
            t50 = _median(ts) if ts else pt
            t90 = _p90(ts, TIME_MARGIN) if ts else pt
            peak = int(_p90(ms, MEMORY_MARGIN)) if ms else (pm or self.default_peak_bytes)
            p50 = int(_median(ms)) if ms else (pm or self.default_peak_bytes)
            return Prediction(t50, t90, max(peak, 1), source, max(min(p50, peak), 1))
        by_model = self._from_model(model, bucket)
        if by_model is not None:
            return by_model
        t, m = self._prior(model, bucket)
        if t is None and m is None:
            return Prediction(None, None, self.default_peak_bytes, "none")
        ft, fm = self._fit
        t90 = t * math.exp(Z90 * ft[3]) if t is not None and ft else t
        m90 = int(m * math.exp(Z90 * fm[3])) if m is not None and fm else None
        return Prediction(t, t90, m90 or self.default_peak_bytes, "prior", m or self.default_peak_bytes)


def _p90(xs: Sequence[float], margin: float) -> float:
    """The p90 of ``xs``; of fewer than :data:`FEW`, their largest times ``margin``."""
    return percentile(xs, 90) if len(xs) >= FEW else max(xs) * margin


def _lstsq(rows: list[tuple[tuple[float, float], float]]) -> tuple[float, float, float, float] | None:
    """(a, b, c, s) minimising sum (y - a - b x0 - c x1)^2 over ``rows``, s the residuals' standard
    deviation; a feature without spread (or that the fit cannot separate) gets 0. None for no rows."""
    if not rows:
        return None
    n = len(rows)
    my = sum(y for _, y in rows) / n
    cols = []
    for j in (0, 1):
        mean = sum(x[j] for x, _ in rows) / n
        var = sum((x[j] - mean) ** 2 for x, _ in rows)
        cols.append((j, mean, var))
    live = [(j, mean) for j, mean, var in cols if var > 1e-12]
    coef = [0.0, 0.0]
    if len(live) == 1:
        j, mean = live[0]
        sxy = sum((x[j] - mean) * (y - my) for x, y in rows)
        coef[j] = sxy / sum((x[j] - mean) ** 2 for x, _ in rows)
    elif len(live) == 2:
        (_, m0), (_, m1) = live
        s00 = sum((x[0] - m0) ** 2 for x, _ in rows)
        s11 = sum((x[1] - m1) ** 2 for x, _ in rows)
        s01 = sum((x[0] - m0) * (x[1] - m1) for x, _ in rows)
        s0y = sum((x[0] - m0) * (y - my) for x, y in rows)
        s1y = sum((x[1] - m1) * (y - my) for x, y in rows)
        det = s00 * s11 - s01 * s01
        if abs(det) > 1e-9 * s00 * s11:
            coef = [(s0y * s11 - s1y * s01) / det, (s1y * s00 - s0y * s01) / det]
    a = my - coef[0] * (sum(x[0] for x, _ in rows) / n) - coef[1] * (sum(x[1] for x, _ in rows) / n)
    sd = math.sqrt(sum((y - a - coef[0] * x[0] - coef[1] * x[1]) ** 2 for x, y in rows) / max(n - 3, 1))
    return a, coef[0], coef[1], sd


def target_predictions(ws: Workspace, targets: Iterable[Target]) -> dict[str, Prediction]:
    """target id -> :class:`Prediction` for ``targets`` of ``ws`` (an opened project): its store's ledger read
    once per workspace (:meth:`~neuron_build.workspace.Workspace.predictor`: the ledger of a build in progress
    is not re-read), keys and backend from the workspace, the memory default ``[build]
    default_compile_memory_gb`` (GB = 1e9 bytes)."""
    pred = ws.predictor(Predictor.from_store)
    backend = ws.keys.backend
    return {t.id: pred.predict(t.id, ws.key(t).key, backend) for t in targets}


def dispatch_jobs(targets: Sequence, predicted: Mapping[str, Prediction], default_memory_gb: float) -> list:
    """:class:`~neuron_build.build.fleet.dispatch.Job` objects of ``targets`` (in matrix order) from their predictions:
    a target without a predicted time counts as the mean of the known ones; each text-generation target waits
    for nothing (a bucket needs no other bucket's NEFF in neuron-build)."""
    from neuron_build.build.fleet.dispatch import Job

    known = [p.seconds for p in predicted.values() if p.seconds is not None]
    fill = sum(known) / len(known) if known else 0.0
    default = int(default_memory_gb * 1e9)
    out = []
    for t in targets:
        p = predicted[t.id]
        secs = p.seconds if p.seconds is not None else fill
        out.append(Job(t.id, secs, p.peak_bytes or default, seconds_p90=p.seconds_p90 or secs,
                       memory_p50=p.peak_p50_bytes))
    return out


def predicted_seconds(ws: Workspace, target: Target) -> float | None:
    """The p50 compile time of one target of ``ws``, seconds (None when nothing is known): the ETA's
    figure."""
    return ws.predictor(Predictor.from_store).predict(target.id, ws.key(target).key, ws.keys.backend).seconds


def predicted_work(ws: Workspace, targets: Iterable[Target]) -> float:
    """Total predicted compile work of ``targets``, seconds (the sum of their p50 times; see :func:`total_work`):
    what a fleet is sized by, e.g. Slurm jobs = ceil(work / (walltime x slots per job))."""
    return total_work(target_predictions(ws, targets).values())


def total_work(predictions: Iterable[Prediction], unknown_s: float | None = None) -> float:
    """Total predicted compile work, seconds (the sum of p50 times). A prediction without a time counts as
    the mean of the known ones (or ``unknown_s`` when given); 0.0 when no time is known at all."""
    preds = list(predictions)
    known = [p.seconds for p in preds if p.seconds is not None]
    fill = unknown_s if unknown_s is not None else (sum(known) / len(known) if known else 0.0)
    return float(sum(known) + fill * (len(preds) - len(known)))


__all__ = ["SOURCES", "Prediction", "Predictor", "bucket_tokens", "dispatch_jobs", "predicted_seconds", "predicted_work",
           "target_predictions", "total_work"]
