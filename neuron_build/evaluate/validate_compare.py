"""Comparing a compiled artifact's outputs with the reference's, output by output.

Part of :mod:`neuron_build.evaluate.validate` (which re-exports every name here): the names of a model
output's tensors (:func:`flatten_outputs`), the error figures of one tensor against its reference
(:func:`compare_tensors`: max absolute error, relative L2 error, cosine similarity, in float64 on the CPU),
the per-output rows with their verdict against a tolerance (:func:`compare_outputs`) and the one-line
message of a failure (:func:`failure_message`). Torch is imported only inside the functions that take
tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def flatten_outputs(out: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Name the tensors of a model output: a tensor is ``output0``; the items of a tuple or list are
    ``output0``, ``output1``, ...; the items of a dict (or a transformers ``ModelOutput``) are named by
    key; nested containers join names with ``.`` (``output1.0``). Non-tensor leaves (None, ints) are
    dropped."""
    import torch

    if isinstance(out, torch.Tensor):
        return [(prefix or "output0", out)]
    items: list[tuple[str, Any]]
    if isinstance(out, dict):
        items = [(str(k), v) for k, v in out.items()]
    elif isinstance(out, (list, tuple)):
        items = [(f"output{i}" if not prefix else str(i), v) for i, v in enumerate(out)]
    else:
        return []
    flat: list[tuple[str, Any]] = []
    for name, v in items:
        flat.extend(flatten_outputs(v, f"{prefix}.{name}" if prefix else name))
    return flat


def compare_tensors(actual, reference) -> dict[str, float]:
    """Error figures of ``actual`` against ``reference`` (same shape), computed in float64 on the CPU.

    Returns:
        ``max_abs_error`` (in the output's units), ``rel_l2_error`` = ||a - r||_2 / ||r||_2 (0 when both
        are zero, inf when only r is), ``cosine_similarity`` (1.0 when both are zero, 0.0 when only one is;
        nan when a holds non-finite values), and ``ref_l2_norm``.
    """
    import torch

    a = actual.detach().to("cpu", torch.float64).reshape(-1)
    r = reference.detach().to("cpu", torch.float64).reshape(-1)
    if a.numel() == 0:
        return {"max_abs_error": 0.0, "rel_l2_error": 0.0, "cosine_similarity": 1.0, "ref_l2_norm": 0.0}
    d = a - r
    dn, rn, an = float(d.norm()), float(r.norm()), float(a.norm())
    if not math.isfinite(dn):
        rel = math.inf
    elif rn == 0:
        rel = 0.0 if dn == 0 else math.inf
    else:
        rel = dn / rn
    if not (math.isfinite(an) and math.isfinite(rn)):
        cos = math.nan
    elif an == 0 and rn == 0:
        cos = 1.0
    elif an == 0 or rn == 0:
        cos = 0.0
    else:
        cos = float(torch.dot(a, r)) / (an * rn)
    mx = float(d.abs().max())
    return {"max_abs_error": mx if math.isfinite(mx) else math.inf, "rel_l2_error": rel,
            "cosine_similarity": cos, "ref_l2_norm": rn}


def compare_outputs(actual: Any, reference: Any, tolerance: float) -> tuple[list[dict[str, Any]], str | None]:
    """Compare two model outputs output by output (see :func:`flatten_outputs` for names).

    Returns:
        (rows, structure problem): one row per reference output with ``name``, ``shape``,
        ``max_abs_error``, ``rel_l2_error``, ``cosine_similarity``, ``tolerance`` and ``pass``
        (relative L2 error <= tolerance, finite); the problem is a one-line message when the outputs do
        not match in names or shapes (rows then cover only the outputs that do).
    """
    fa, fr = dict(flatten_outputs(actual)), flatten_outputs(reference)
    rows, problems = [], []
    if [n for n, _ in fr] != list(fa):
        problems.append(f"the artifact returns outputs {list(fa) or 'none'}, the reference {[n for n, _ in fr]}")
    for name, r in fr:
        a = fa.get(name)
        if a is None:
            continue
        if tuple(a.shape) != tuple(r.shape):
            problems.append(f"{name} has shape {list(a.shape)}, the reference {list(r.shape)}")
            continue
        m = compare_tensors(a, r)
        ok = math.isfinite(m["rel_l2_error"]) and m["rel_l2_error"] <= tolerance
        rows.append({"name": name, "shape": list(r.shape), "dtype": str(a.dtype).removeprefix("torch."),
                     "max_abs_error": m["max_abs_error"], "rel_l2_error": m["rel_l2_error"],
                     "cosine_similarity": m["cosine_similarity"], "ref_l2_norm": m["ref_l2_norm"],
                     "tolerance": tolerance, "pass": ok})
    return rows, ("; ".join(problems) or None)


def failure_message(target_id: str, rows: Sequence[dict[str, Any]]) -> str:
    """One line naming every failing output, its error and the tolerance, e.g.
    ``rmsnorm_fused/static/fp32/o1: output0 rel L2 error 3.1e-03 > tolerance 1.0e-04 (max abs error
    2.0e-02, cosine 0.999995)``."""
    parts = [f"{r['name']} rel L2 error {r['rel_l2_error']:.1e} > tolerance {r['tolerance']:.1e} "
             f"(max abs error {r['max_abs_error']:.1e}, cosine {r['cosine_similarity']:.6f})"
             for r in rows if not r["pass"]]
    return f"{target_id}: " + "; ".join(parts)


__all__ = ["compare_outputs", "compare_tensors", "failure_message", "flatten_outputs"]
