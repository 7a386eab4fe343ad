"""The buckets that minimise padding for a given number of NEFFs, from counted traffic.

Traffic is a table of request counts per value tuple of the searched bucket dims (``{(40,): 17, ...}``
for ``seq``; ``{(3, 40): 17}`` for ``batch, seq``). A model's buckets are the product of one list of
sizes per dim (``buckets.toml``), and a request runs in the smallest bucket that fits it
(:mod:`neuron_build.runtime`), which in a product grid is the smallest size >= the request's in every dim.

**Padding ratio** over the searched dims ``D``::

    sum(count * (prod_D bucket - prod_D value)) / sum(count * prod_D value)

over the requests the buckets serve; for one dim that is ``sum(count * (bucket - value)) / sum(count * value)``.
A suggestion serves every request in one call: its largest size in each dim is >= the largest value seen.

**One dim: exact.** Only sizes equal to an observed value (or, with ``multiple=M``, an observed value
rounded up to a multiple of M) can be in an optimal list: any other size can be lowered to the largest
such candidate it serves, which serves the same requests with less padding. Over the sorted candidates
``u_1 < ... < u_m`` with request weights ``W_j`` (the requests whose candidate is ``u_j``), a list of
``k`` sizes ending at ``u_j`` costs ``f(k, j) = min_i f(k-1, i) + u_j * (W_{i+1} + ... + W_j)``. That cost
is Monge (its quadrangle inequality holds because the prefix sums of ``W`` grow), so the best ``i`` grows
with ``j`` and each row is found by divide and conquer: O(K m log m) in exact integer arithmetic.

**Several dims: exact where small enough, a stated heuristic where not.** For each split of the NEFF
budget into list lengths ``k_1 x ... x k_n <= K``: with every dim's list but the one with the most
candidates fixed, the best list of that last dim is the one-dim optimum with weights ``count * prod of
the other dims' bucket sizes``, so enumerating the other dims' lists (each holding its largest candidate)
and solving the last dim exactly is exact; it is done for each split of the other dims' list lengths
whose enumeration times the distinct value tuples of the traffic is at most :data:`JOINT_EXACT_LIMIT`. Otherwise **coordinate descent**: start from each dim's one-dim
optimum of its own counts, then re-solve one dim at a time exactly (the weighted one-dim optimum given
the others) until no step lowers the padding; each step is exact, so the padding never rises, and the
result is a list no single dim's change improves, not always the joint optimum. The method used is
reported (``exact`` or ``coordinate-descent``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from neuron_build.project.config import ModelSpec
    from neuron_build.traffic import ModelTraffic

#: The exact joint search of one split of the other dims' list lengths is done when (lists of those dims to
#: enumerate) x (distinct value tuples in the traffic) is at most this; else coordinate descent.
JOINT_EXACT_LIMIT = 200_000
#: The most rounds of coordinate descent.
DESCENT_ROUNDS = 50


def round_up(v: int, multiple: int | None) -> int:
    """``v`` rounded up to a multiple of ``multiple`` (``v`` itself when None or 1)."""
    if not multiple or multiple == 1:
        return v
    return -(-v // multiple) * multiple


def optimal_lists(weights: Mapping[int, int], k_max: int, multiple: int | None = None,
                  top: int | None = None) -> list[tuple[int, list[int]]]:
    """The one-dim optimum for every list length: minimises ``sum(weight(v) * bucket(v))``.

    Args:
        weights: value -> weight (a request count, or a count times the other dims' sizes); values >= 1,
            weights >= 0.
        k_max: the most sizes in a list.
        multiple: sizes are multiples of this (None: any size).
        top: the largest size of every list is at least this (rounded up to ``multiple``): today's largest
            bucket, kept although the traffic never reached it (None: the largest value rounded up).

    Returns:
        ``[(cost, sizes)]`` for k = 1 .. min(k_max, number of candidates): ``cost`` the minimal
        ``sum(weight * bucket)`` (an int), ``sizes`` ascending, its last the largest value (or ``top``) rounded up.
    """
    cand: dict[int, int] = {}
    for v, w in weights.items():
        u = round_up(int(v), multiple)
        cand[u] = cand.get(u, 0) + int(w)
    if cand and top is not None and round_up(int(top), multiple) > max(cand):
        cand[round_up(int(top), multiple)] = 0     # serves nothing seen; the list must end there
    u = sorted(cand)
    m = len(u)
    if m == 0:
        return []
    pre = [0]
    for x in u:
        pre.append(pre[-1] + cand[x])
    inf = None

    def cost(i: int, j: int) -> int:  # groups i+1..j (1-based) served by u_j
        return u[j - 1] * (pre[j] - pre[i])

    prev = [inf] + [cost(0, j) for j in range(1, m + 1)]
    args: list[list[int]] = [[0] * (m + 1)]
    rows = [prev]
    kk = min(k_max, m)
    for k in range(2, kk + 1):
        cur: list[int | None] = [inf] * (m + 1)
        arg = [0] * (m + 1)

        def solve(lo: int, hi: int, olo: int, ohi: int, prev=prev, cur=cur, arg=arg, k=k) -> None:
            stack = [(lo, hi, olo, ohi)]
            while stack:
                lo, hi, olo, ohi = stack.pop()
                if lo > hi:
                    continue
                mid = (lo + hi) // 2
                best, bi = None, olo
                for i in range(max(olo, k - 1), min(ohi, mid - 1) + 1):
                    if prev[i] is None:
                        continue
                    c = prev[i] + cost(i, mid)
                    if best is None or c < best:
                        best, bi = c, i
                cur[mid], arg[mid] = best, bi
                stack.append((lo, mid - 1, olo, bi))
                stack.append((mid + 1, hi, bi, ohi))

        solve(k, m, k - 1, m - 1)
        rows.append(cur)
        args.append(arg)
        prev = cur
    out = []
    for k in range(1, kk + 1):
        sizes, j = [], m
        for r in range(k, 0, -1):
            sizes.append(u[j - 1])
            j = args[r - 1][j] if r > 1 else 0
        out.append((rows[k - 1][m], sorted(sizes)))
    return out


def serve(value: int, sizes: Sequence[int]) -> int | None:
    """The smallest of ``sizes`` >= ``value`` (None: none is)."""
    fit = [s for s in sizes if s >= value]
    return min(fit) if fit else None


@dataclass
class Evaluation:
    """Buckets judged on traffic: ``padded`` and ``real`` positions of the served requests, ``padding_ratio``
    (padded / real), ``unserved`` (requests larger than every bucket), ``chunked`` (requests split into
    batch chunks), ``truncated`` (requests cut to the largest bucket)."""

    buckets: dict[str, list[int]]
    padded: int
    real: int
    unserved: int = 0
    chunked: int = 0
    truncated: int = 0

    @property
    def padding_ratio(self) -> float | None:
        return self.padded / self.real if self.real else None

    @property
    def neffs(self) -> int:
        return math.prod(len(v) for v in self.buckets.values())

    def to_json(self) -> dict:
        return {"buckets": self.buckets, "padding_ratio": self.padding_ratio, "unserved": self.unserved,
                "neffs": self.neffs, "padded": self.padded, "real": self.real, "chunked": self.chunked,
                "truncated": self.truncated}


def evaluate(counts: Mapping[tuple[int, ...], int], dims: Sequence[str], buckets: Mapping[str, Sequence[int]], *,
             batch_dim: str | None = None, truncate: bool = False) -> Evaluation:
    """The padding of ``buckets`` (dim -> sizes) on ``counts`` (value tuple over ``dims`` -> requests), as
    :class:`neuron_build.runtime.BucketedModel` routes them: the smallest size that fits in each dim; a
    batch larger than every bucket (``batch_dim``, when searched) split into chunks of the largest batch size
    and the rest; a value larger than every bucket along another dim cut to the largest when ``truncate``,
    else the request is unserved (left out of the padding ratio)."""
    padded = real = unserved = chunked = truncated = 0
    lists = [sorted(buckets[d]) for d in dims]
    for v, c in counts.items():
        runs: list[list[int]] = [[]]   # per chunk: the run sizes per dim
        bucket_runs = []
        ok = True
        cut = list(v)
        for i, d in enumerate(dims):
            top = lists[i][-1]
            if v[i] > top and d != batch_dim:
                if not truncate:
                    ok = False
                    break
                cut[i] = top
        if not ok:
            unserved += c
            continue
        if cut != list(v):
            truncated += c
        bi = dims.index(batch_dim) if batch_dim in dims else None
        if bi is not None and cut[bi] > lists[bi][-1]:
            top = lists[bi][-1]
            parts = [top] * (cut[bi] // top) + ([cut[bi] % top] if cut[bi] % top else [])
            chunked += c
        else:
            parts = [cut[bi]] if bi is not None else [None]
        runs = []
        for n in parts:
            r = list(cut)
            if bi is not None:
                r[bi] = n
            runs.append(r)
        for r in runs:
            b = [serve(x, lists[i]) for i, x in enumerate(r)]
            bucket_runs.append((math.prod(b), math.prod(r)))
        padded += c * sum(pb - pr for pb, pr in bucket_runs)
        real += c * math.prod(cut)
    return Evaluation({d: list(lst) for d, lst in zip(dims, lists, strict=True)}, padded, real, unserved, chunked,
                      truncated)


def _cost(counts: Mapping[tuple[int, ...], int], lists: Sequence[Sequence[int]]) -> int:
    """``sum(count * prod(bucket))`` of lists that serve every value."""
    return sum(c * math.prod(serve(x, lst) for x, lst in zip(v, lists, strict=True)) for v, c in counts.items())


def _dim_weights(counts, lists, d: int) -> dict[int, int]:
    """Weights of dim ``d``'s values given the other dims' lists: count * prod of their bucket sizes."""
    w: dict[int, int] = {}
    for v, c in counts.items():
        other = math.prod(serve(x, lst) for i, (x, lst) in enumerate(zip(v, lists, strict=True)) if i != d)
        w[v[d]] = w.get(v[d], 0) + c * other
    return w


def _lists_of(values: Sequence[int], k: int) -> list[list[int]]:
    """Every list of ``k`` of the sorted candidates ``values`` that holds the largest."""
    top, rest = values[-1], values[:-1]
    return [sorted([*combo, top]) for combo in itertools.combinations(rest, k - 1)]


def _descent(counts, ks: tuple[int, ...], mults, tops) -> tuple[int, list[list[int]], str]:
    """Coordinate descent for lists of lengths ``ks``, from the per-dim optima of each dim's own counts."""
    n = len(ks)
    lists = []
    for i in range(n):
        marg: dict[int, int] = {}
        for v, c in counts.items():
            marg[v[i]] = marg.get(v[i], 0) + c
        lists.append(optimal_lists(marg, ks[i], mults[i], tops[i])[ks[i] - 1][1])
    cost = _cost(counts, lists)
    for _ in range(DESCENT_ROUNDS):
        improved = False
        for i in range(n):
            c_i, sizes = optimal_lists(_dim_weights(counts, lists, i), ks[i], mults[i], tops[i])[ks[i] - 1]
            if c_i < cost:
                lists[i], cost, improved = sizes, c_i, True
        if not improved:
            break
    return cost, lists, "coordinate-descent"


def _splits(counts, cands: list[list[int]], max_buckets: int, mults, tops) -> dict:
    """The best lists for every split of list lengths ``ks`` with ``prod(ks) <= max_buckets``:
    ``{ks: (cost, lists, method)}``."""
    n = len(cands)
    if n == 1:
        res = optimal_lists({v[0]: c for v, c in counts.items()}, max_buckets, mults[0], tops[0])
        return {(k,): (cost, [sizes], "exact") for k, (cost, sizes) in enumerate(res, 1)}
    last = max(range(n), key=lambda i: len(cands[i]))
    others = [i for i in range(n) if i != last]
    out: dict[tuple[int, ...], tuple[int, list[list[int]], str]] = {}
    for oks in itertools.product(*(range(1, min(max_buckets, len(cands[i])) + 1) for i in others)):
        room = max_buckets // math.prod(oks)
        if room < 1:
            continue
        combos = math.prod(math.comb(len(cands[i]) - 1, k - 1) for i, k in zip(others, oks, strict=True))

        def full(kl: int, oks=oks) -> tuple[int, ...]:
            ks = [0] * n
            for i, k in zip(others, oks, strict=True):
                ks[i] = k
            ks[last] = kl
            return tuple(ks)

        if combos * len(counts) > JOINT_EXACT_LIMIT:
            for kl in range(1, min(room, len(cands[last])) + 1):
                out[full(kl)] = _descent(counts, full(kl), mults, tops)
            continue
        for pick in itertools.product(*(_lists_of(cands[i], k) for i, k in zip(others, oks, strict=True))):
            lists: list[list[int]] = [[] for _ in range(n)]
            for i, lst in zip(others, pick, strict=True):
                lists[i] = lst
            lists[last] = [max(cands[last])]   # a placeholder: _dim_weights leaves dim `last` out
            res = optimal_lists(_dim_weights(counts, lists, last), room, mults[last], tops[last])
            for kl, (cost, sizes) in enumerate(res, 1):
                ks = full(kl)
                if ks not in out or cost < out[ks][0]:
                    out[ks] = (cost, [*lists[:last], sizes, *lists[last + 1:]], "exact")
    return out


def suggest(counts: Mapping[tuple[int, ...], int], dims: Sequence[str], max_buckets: int,
            multiple: int | None | Sequence[int | None] = None,
            tops: Sequence[int | None] | None = None) -> list[tuple[Evaluation, str]]:
    """The best buckets for each NEFF budget n = 1 .. ``max_buckets``: ``[(evaluation, method)]`` (entries
    stop once every candidate has its own bucket: more NEFFs cannot lower the padding further).

    Args:
        counts: value tuple over ``dims`` -> requests (values >= 1).
        dims: the searched bucket dims.
        max_buckets: the most buckets (NEFFs per dtype and profile: the product of the list lengths).
        multiple: every size a multiple of this (None: any size), or one such per dim of ``dims``.
        tops: per dim of ``dims``, a size the largest bucket must reach (today's largest; None: the largest
            value seen, rounded up).

    Raises:
        ValueError: no traffic, or ``max_buckets`` < 1.
    """
    if max_buckets < 1:
        raise ValueError(f"max_buckets is {max_buckets}; give 1 or more")
    counts = {tuple(int(x) for x in v): int(c) for v, c in counts.items() if c > 0}
    if not counts:
        raise ValueError("no requests in the traffic")
    n = len(dims)
    real = sum(c * math.prod(v) for v, c in counts.items())
    mults = list(multiple) if isinstance(multiple, (list, tuple)) else [multiple] * n
    tops = list(tops) if tops is not None else [None] * n
    cands = [sorted({round_up(v[i], mults[i]) for v in counts}) for i in range(n)]
    for i, top in enumerate(tops):    # today's largest bucket, above every value seen: a candidate that serves none
        if top and round_up(top, mults[i]) > cands[i][-1]:
            cands[i].append(round_up(top, mults[i]))
    splits = _splits(counts, cands, max_buckets, mults, tops)
    full = math.prod(len(c) for c in cands)
    out: list[tuple[Evaluation, str]] = []
    for budget in range(1, min(max_buckets, full) + 1):
        fits = [(cost, math.prod(ks), ks) for ks, (cost, _l, _m) in splits.items() if math.prod(ks) <= budget]
        cost, _neffs, ks = min(fits)
        lists = splits[ks][1]
        # the optimum only when every split within the budget was searched exactly
        method = "exact" if all(splits[k][2] == "exact" for _c, _n, k in fits) else "coordinate-descent"
        out.append((Evaluation({d: list(lst) for d, lst in zip(dims, lists, strict=True)}, cost - real, real),
                    method))
    return out


def batch_dim_of(spec: ModelSpec) -> str | None:
    """The dim a serving host splits into chunks: ``batch`` when it is a bucket dim leading every input
    (:attr:`neuron_build.runtime.BucketedModel.batch_dim`)."""
    lead = {i.shape[0] for i in spec.inputs}
    return "batch" if "batch" in spec.buckets and lead == {"batch"} else None


def suggestion(spec: ModelSpec, traffic: ModelTraffic, dims: Sequence[str], max_buckets: int,
               multiple: int | None = None, narrow: bool = False) -> dict:
    """The current buckets of a model and the best for ``max_buckets`` NEFFs on its traffic, as one document.

    Args:
        spec: the model's ``[models.NAME]``.
        traffic: its summed traffic (every stored shape must have every dim of ``dims``).
        dims: the searched bucket dims (the others are left as they are and summed out).
        max_buckets: the most buckets over ``dims`` (the product of their list lengths).
        multiple: every suggested size a multiple of this, except the batch dim's when other dims are
            searched too (batch sizes are small; compilers want multiples along sequence dims).
        narrow: let the search end a dim below today's largest bucket when the traffic never reached it
            (default: the largest suggested size of each dim is at least today's largest, so a suggestion
            never refuses a request today's buckets serve).

    Returns:
        ``{"dims", "requests", "distinct", "method", "current", "suggested", "curve"}``: ``current`` and
        ``suggested`` as :meth:`Evaluation.to_json` (``buckets`` dim -> sizes, ``padding_ratio``,
        ``unserved``, ``neffs``, ``padded``, ``real``); ``curve`` one entry per budget n = 1 .. K with
        ``budget``, the evaluation, ``method`` and ``gain`` (padding ratio the n-th NEFF removes). The current
        buckets are a candidate (:func:`current_is_candidate`): when nothing searched pads less, they are the
        suggestion (``suggested_source`` ``"current"``, else ``"search"``). ``worse_than_current``: the
        suggestion pads more than the current buckets, which serve every request (e.g. they are within the
        budget but not multiples of ``multiple``, or need more NEFFs than ``max_buckets``); then ``remedies``
        says what would not be worse (:func:`remedies`).

    Raises:
        ValueError: the traffic holds no request.
    """
    counts = traffic.counts(dims)
    current = evaluate(counts, dims, {d: list(spec.buckets[d]) for d in dims}, batch_dim=batch_dim_of(spec),
                       truncate=spec.truncate)
    mults = [None if d == "batch" and len(dims) > 1 else multiple for d in dims]
    tops = None if narrow else [max(spec.buckets[d]) for d in dims]
    curve = suggest(counts, dims, max_buckets, mults, tops)
    rows, prev = [], None
    for n, (ev, method) in enumerate(curve, 1):
        r = ev.padding_ratio
        rows.append({"budget": n, **ev.to_json(), "method": method,
                     "gain": None if prev is None else prev - r})
        prev = r
    best, method = curve[-1]
    methods = {m for _e, m in curve}
    source = "search"
    if current_is_candidate(current, max_buckets, dict(zip(dims, mults, strict=True))) and (
            best.padding_ratio is None or current.padding_ratio <= best.padding_ratio):
        best, method, source = current, "current", "current"  # nothing searched pads less: keep today's
    cur_r, best_r = current.padding_ratio, best.padding_ratio
    worse = current.unserved == 0 and cur_r is not None and best_r is not None and best_r > cur_r
    return {"dims": list(dims), "requests": sum(counts.values()), "distinct": len(counts),
            "method": "exact" if methods == {"exact"} else "coordinate-descent",
            "suggested_method": method, "suggested_source": source, "worse_than_current": worse,
            "remedies": remedies(counts, dims, current, mults, tops, max_buckets, len(curve)) if worse else {},
            "current": current.to_json(), "suggested": best.to_json(), "curve": rows}


#: ``remedies`` searches budgets up to this many NEFFs above ``--max-buckets``.
REMEDY_EXTRA_BUDGET = 16


def remedies(counts, dims: Sequence[str], current: Evaluation, mults: Sequence[int | None], tops, max_buckets: int,
             searched: int) -> dict:
    """What would give a suggestion no worse than today's buckets, each checked, never guessed:
    ``max_buckets`` the smallest larger budget (up to :data:`REMEDY_EXTRA_BUDGET` more) whose search pads no
    more than ``current`` (absent when more NEFFs cannot help); ``not_multiple`` a size of today's buckets
    that is no multiple of its dim's ``multiple`` when, without ``--multiple``, today's buckets would be kept
    (``{"dim", "size", "multiple"}``)."""
    out: dict = {}
    if searched >= max_buckets:   # the curve stopped early: every candidate already had its own bucket
        curve = suggest(counts, dims, max_buckets + REMEDY_EXTRA_BUDGET, mults, tops)
        for n, (ev, _m) in enumerate(curve, 1):
            if n > max_buckets and ev.padding_ratio is not None and ev.padding_ratio <= current.padding_ratio:
                out["max_buckets"] = n
                break
    for d, m in zip(dims, mults, strict=True):
        bad = [v for v in current.buckets[d] if m and v % m]
        if bad and current_is_candidate(current, max_buckets, dict.fromkeys(dims)):
            out["not_multiple"] = {"dim": d, "size": bad[0], "multiple": m}
            break
    return out


def current_is_candidate(current: Evaluation, max_buckets: int, multiples: Mapping[str, int | None]) -> bool:
    """Whether today's buckets may be the suggestion: they serve every request in one call (none unserved,
    chunked or truncated), need at most ``max_buckets`` NEFFs, and every size of a dim is a multiple of that
    dim's entry in ``multiples`` (None: any size)."""
    if current.unserved or current.chunked or current.truncated or current.neffs > max_buckets:
        return False
    return all(m is None or all(v % m == 0 for v in current.buckets[d]) for d, m in multiples.items())


def narrower_dims(doc: Mapping) -> dict[str, dict[str, int]]:
    """The dims whose largest suggested bucket is below today's largest, in a :func:`suggestion` document:
    requests the current buckets serve that the suggested ones would refuse (the traffic may simply not have
    held them yet). dim -> ``current`` and ``suggested`` largest sizes."""
    cur, sug = (doc.get("current") or {}).get("buckets") or {}, (doc.get("suggested") or {}).get("buckets") or {}
    out = {}
    for d, sizes in sug.items():
        if sizes and cur.get(d) and max(sizes) < max(cur[d]):
            out[d] = {"current": int(max(cur[d])), "suggested": int(max(sizes))}
    return out


__all__ = ["DESCENT_ROUNDS", "JOINT_EXACT_LIMIT", "REMEDY_EXTRA_BUDGET", "Evaluation", "current_is_candidate", "evaluate",
           "narrower_dims", "optimal_lists", "remedies", "round_up", "serve",
           "suggest", "suggestion", "batch_dim_of"]
