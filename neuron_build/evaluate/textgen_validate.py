"""Validation of a text-generation graph: greedy generation from the compiled graphs against
transformers' ``generate(do_sample=False)`` of the eager fp32 model on the CPU.

A graph cannot run alone (prefill fills the KV cache, decode reads it), so each target is checked with
its partner of the same model, dtype, profile and batch size: a prefill target with the decode graph, a
decode target with the smallest prefill bucket. Both must be built (``doit validate`` builds them first).

Scenarios (rows of the record's ``outputs``): at the target's batch size, prompts of two lengths (the
prefill bucket's ``seq`` and half of it; for a decode target 1 and the prefill bucket's ``seq``) drawn
from the seed :func:`neuron_build.evaluate.validate_setup.validation_seed`, each generating
``min(8, max_seq_len - length)`` new tokens with ``eos`` off on both sides (``min_new_tokens``). Per row:

- the reference's tokens are its ``generate()``; both sides are then fed those tokens (teacher forcing: the
  compiled prefill, then one decode step per token, :meth:`~neuron_build.compilers.textgen_serve.TextGenEngine.forced_logits`;
  the reference's forward over the same tokens), so one differing token does not derail the steps after it;
- ``tokens_equal``, ``first_diff`` (the first new-token position where the compiled argmax differs, None when
  equal), ``margin`` (there, the gap of the reference's top-2 logits relative to its largest absolute logit),
  ``ties`` and ``diverged`` (:func:`judge_tokens`), and ``new_tokens``;
- ``rel_l2_error``, ``max_abs_error``, ``cosine_similarity``: the logits of the first new token (the
  prefill graph's logits at the prompt's last position, fp32) against the eager fp32 model's;
  ``steps_rel_l2_error``: the logits of every new position.

Verdict: **fp32** passes when every new token equals the reference's or is a **tie** (the compiled token is
the reference's runner-up and the reference's top-2 logits are within the model's ``tolerance`` for the
dtype of each other, relative to its largest logit: with random weights two logits can agree to 1e-7, and
float noise decides which wins); **bf16/fp16** pass when every row's first-token logits error is within
the tolerance (default 2e-2): greedy tokens of a reduced-precision model legitimately drift, and
``first_diff`` says where. A reference that does not build is no verdict (``error``), not a failure.
"""

from __future__ import annotations

import math
from typing import Any

from neuron_build.errors import NeuronBuildError, UserError
from neuron_build.project.matrix import Target


class ReferenceFailed(NeuronBuildError):
    """The reference (the eager fp32 model on the CPU) did not build or run: no verdict can be reached
    (:func:`neuron_build.evaluate.validate_run.validate_here` records ``error``, never ``fail``)."""


def partners(targets: list[Target], target: Target) -> list[Target]:
    """The graphs ``target`` runs with: every text-generation target of its model, dtype, profile and batch
    size (itself included), prefill first by seq, then decode."""
    b = dict(target.bucket)["batch"]
    same = [t for t in targets if t.graph and t.model == target.model and t.dtype == target.dtype
            and t.profile == target.profile and dict(t.bucket)["batch"] == b]
    return sorted(same, key=lambda t: (t.graph != "prefill", dict(t.bucket).get("seq", 0)))


def textgen_source(project, store, target: Target, chosen: list[tuple[Target, str, Any]]):
    """What :func:`neuron_build.compilers.textgen_load.load_textgen` loads of built graphs in ``store``:
    ``chosen`` holds ``(target, key, manifest)`` of each (the files' sha256 as the manifest lists them);
    the model as built (``target``'s dtype) for a compile-cache build."""
    from neuron_build.compilers.textgen_load import TextGenGraph, TextGenSource
    from neuron_build.examples import build_model

    spec = project.config.models[target.model]
    m0 = chosen[0][2]
    graphs = []
    for _t, k, m in chosen:
        d = store.artifact_dir(k)
        graphs.append(TextGenGraph(d, files={n: (d / n, f.sha256) for n, f in m.files.items()}))
    keys = ", ".join(k[:12] for _t, k, _m in chosen)
    return TextGenSource(target.model, m0.backend, tuple(graphs), f"{target.id} (key {keys})", spec.max_seq_len,
                         m0.hardware_target, (m0.compiler or {}).get("serving"),
                         lambda: build_model(project.root, spec.factory, dict(spec.kwargs), target.dtype,
                                             hf=spec.hf_spec()))


def _plan(project, target: Target) -> tuple[list[Target], list[int]]:
    """(the graphs ``target`` is validated with, the prompt lengths): a prefill target with the decode graph
    (its ``seq`` and half of it), a decode target with the smallest prefill bucket (1 and that bucket's
    ``seq``), an NxDI compile alone (the longest context bucket and half of it)."""
    from neuron_build.project.matrix import expand

    spec = project.config.models[target.model]
    group = partners(expand(project), target)
    prefills = [t for t in group if t.graph == "prefill"]
    if target.graph == "prefill":
        s = dict(target.bucket)["seq"]
        return [target] + [t for t in group if t.graph == "decode"], sorted({s, max(1, s // 2)})
    if target.graph == "nxdi":  # one NxDI compile holds every prefill and decode bucket of a batch size
        s = max(spec.buckets.get("seq") or [1])
        return [target], sorted({s, max(1, s // 2)})
    s = dict(prefills[0].bucket)["seq"] if prefills else 1
    return prefills[:1] + [target], sorted({1, s})


def _built(store, keys, target: Target, use: list[Target]) -> list[tuple[Target, str, Any]]:
    """``(target, key, manifest)`` of each graph in ``use``.

    Raises:
        UserError: one is not built for its current key (one line: what to build)."""
    chosen = []
    for t in use:
        k = keys.key(t).key
        m = store.manifest(k)
        if m is None:
            raise UserError(f"{target.id} is validated with {t.id}, which is not built for its current key "
                            f"{k[:12]}; run `neuron-build build {target.model}` (or `doit validate`)")
        chosen.append((t, k, m))
    return chosen


def _reference(project, target: Target):
    """The eager fp32 model (transformers' default ``generate()``).

    Raises:
        ReferenceFailed: it did not build (no verdict)."""
    from neuron_build.compilers.textgen import causal_lm
    from neuron_build.examples import build_model

    spec = project.config.models[target.model]
    try:
        ref = causal_lm(build_model(project.root, spec.factory, dict(spec.kwargs), "fp32", hf=spec.hf_spec()))
    except Exception as e:  # no reference: no verdict
        raise ReferenceFailed(f"the fp32 reference {target.model} did not build: {type(e).__name__}: "
                              f"{(str(e).strip().splitlines() or [''])[0][:300]}") from e
    ref.generation_config.cache_implementation = None  # the reference runs transformers' default generate()
    return ref


def validate_textgen(project, store, target: Target, keys, rec: dict[str, Any], tol: float, seed: int,
                     compare_tensors) -> dict[str, Any]:
    """Fill ``rec`` (the record :func:`neuron_build.evaluate.validate.validate_target` started) with the
    rows and verdict of a text-generation target (module docstring); ``seed`` draws the prompts,
    ``compare_tensors`` is :func:`neuron_build.evaluate.validate.compare_tensors`. The compiled graphs are
    loaded as serving loads them (:func:`neuron_build.compilers.textgen_load.load_textgen`).

    Raises:
        UserError: a partner graph is not built; the backend has no text-generation serving engine.
    """
    import torch

    from neuron_build.compilers.textgen_load import load_textgen

    spec = project.config.models[target.model]
    use, lengths = _plan(project, target)
    chosen = _built(store, keys, target, use)
    engine, _installed = load_textgen(textgen_source(project, store, target, chosen))
    ref = _reference(project, target)
    batch = dict(target.bucket)["batch"]
    vocab = int(ref.config.vocab_size)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        new = max(1, min(8, spec.max_seq_len - n))
        prompt = torch.randint(0, vocab, (batch, n), generator=g)
        with torch.no_grad():
            want = ref.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                min_new_tokens=new, do_sample=False, pad_token_id=0)
            ref_logits = ref(input_ids=want[:, :n + new - 1]).logits[:, n - 1:].float()
        steps, m, ok, steps_err = _judge(engine, prompt, want, ref_logits, target.dtype, tol, compare_tensors)
        rows.append({"name": f"generate b{batch} prompt {n} +{new} tokens", "shape": [batch, n + new],
                     "dtype": target.dtype, **steps, "new_tokens": new,
                     "max_abs_error": m["max_abs_error"], "rel_l2_error": m["rel_l2_error"],
                     "cosine_similarity": m["cosine_similarity"], "ref_l2_norm": m["ref_l2_norm"],
                     "steps_rel_l2_error": steps_err,
                     "tolerance": tol, "pass": ok})
    rec["outputs"] = rows
    rec["partners"] = [t.id for t, _, _ in chosen]
    return _verdict(rec, target, rows, tol)


def _judge(engine, prompt, want, ref_logits, dtype: str, tol: float, compare_tensors):
    """(steps, first-token logits metrics, pass, every step's rel L2 error) of one prompt: teacher-forced logits
    when the engine gives them, else (NxDI) its tokens against the reference's."""
    import torch

    n = int(prompt.shape[1])
    if hasattr(engine, "forced_logits"):
        # the compiled graphs fed the reference's tokens (teacher forcing): a tie does not derail the
        # steps after it
        logits = engine.forced_logits(prompt, want[:, n:])
        steps = judge_tokens(logits, ref_logits, want[:, n:], tol)
        m = compare_tensors(logits[:, 0], ref_logits[:, 0])
        ok = not steps["diverged"] if dtype == "fp32" else (
            math.isfinite(m["rel_l2_error"]) and m["rel_l2_error"] <= tol)
        return steps, m, ok, compare_tensors(logits, ref_logits)["rel_l2_error"]
    # NxDI samples on the device and returns tokens only: no logits to compare, no teacher forcing
    got = engine.generate(prompt, max_new_tokens=int(want.shape[1]) - n)
    a, b = got[:, n:], want[:, n:]
    diff = (a != b).any(0).nonzero().flatten() if a.shape == b.shape else torch.tensor([0])
    equal = bool(a.shape == b.shape and torch.equal(a, b))
    steps = {"tokens_equal": equal, "first_diff": int(diff[0]) if diff.numel() else None, "margin": None,
             "ties": 0, "diverged": not equal}
    m = dict.fromkeys(("max_abs_error", "rel_l2_error", "cosine_similarity", "ref_l2_norm"))
    ok = equal if dtype == "fp32" else bool(a.shape == b.shape and torch.equal(a[:, :1], b[:, :1]))
    return steps, m, ok, None


def _verdict(rec: dict[str, Any], target: Target, rows: list[dict[str, Any]], tol: float) -> dict[str, Any]:
    """``rec`` with its ``measure``, ``verdict`` and ``reason`` (the first failing row's)."""
    from neuron_build.status import Verdict

    rec["measure"] = ("fp32: greedy tokens equal to the eager model's generate(), fed the reference's tokens, except "
                      "ties (the reference's top-2 logits within the tolerance, relative to its largest logit); "
                      "bf16/fp16: relative L2 error of the first new token's logits within the tolerance "
                      "(first_diff: the first differing token, margin: the reference's top-2 gap there)")
    if target.graph == "nxdi":
        rec["measure"] = ("NxDI (tokens only, sampled on the device): fp32: greedy tokens equal to the eager model's "
                          "generate(); bf16/fp16: the first new token equal (first_diff: the first differing token)")
    bad = [r for r in rows if not r["pass"]]
    if not bad:
        rec.update(verdict=Verdict.PASS, reason=None)
        return rec
    r = bad[0]
    why = (f"tokens differ from the eager generate() from new token {r['first_diff']} on"
           if r.get("margin") is None and (target.dtype == "fp32" or r["rel_l2_error"] is None)
           else f"new token {r['first_diff']} differs from the eager generate()'s, which is no tie (the "
           f"reference's top-2 logits are {r['margin']:.1e} apart, relative to its largest logit, > tolerance "
           f"{tol:.1e})"
           if target.dtype == "fp32"
           else f"first-token logits rel L2 error {r['rel_l2_error']:.2e} > tolerance {tol:.1e}")
    rec.update(verdict=Verdict.FAIL, reason=f"{target.id}: {r['name']}: {why}")
    return rec


def judge_tokens(logits, ref_logits, ref_tokens, tol: float) -> dict[str, Any]:
    """Compare greedy tokens step by step, both sides fed the reference's tokens (teacher forcing).

    Args:
        logits: fp32 ``[rows, steps, vocab]``, the compiled graphs' logits at each new position.
        ref_logits: fp32 ``[rows, steps, vocab]``, the reference's at the same positions.
        ref_tokens: int64 ``[rows, steps]``, the reference's tokens (its ``generate()``).
        tol: the tie tolerance, relative to the reference's largest absolute logit at the step.

    Returns:
        ``tokens_equal`` (the compiled argmax equals the reference's token at every step), ``first_diff`` (the
        first step where it does not, or None), ``margin`` (the reference's top-2 gap at that step, relative
        to its largest absolute logit; None without a difference), ``ties`` (differing steps where the
        compiled token is the reference's runner-up and the gap is within ``tol``: a near-tie that float
        noise decides, not an error) and ``diverged`` (differing steps that are no tie; each fails fp32).
    """
    import torch

    got = logits.argmax(-1)
    differ = (got != ref_tokens).any(0).nonzero().flatten().tolist()
    ties, diverged, margin = 0, 0, None
    for i in differ:
        for r in range(got.shape[0]):
            if int(got[r, i]) == int(ref_tokens[r, i]):
                continue
            top = torch.topk(ref_logits[r, i], 2)
            scale = float(ref_logits[r, i].abs().max()) or 1.0
            gap = (float(top.values[0]) - float(top.values[1])) / scale
            if margin is None:
                margin = gap
            tie = int(got[r, i]) in top.indices.tolist() and int(ref_tokens[r, i]) in top.indices.tolist() and gap <= tol
            ties += tie
            diverged += not tie
    return {"tokens_equal": not differ, "first_diff": differ[0] if differ else None, "margin": margin,
            "ties": ties, "diverged": diverged}


def bench_callables(project, store, target: Target, key: str, manifest):
    """What the benchmark times for a text-generation graph: ``(compiled, eager, inputs)``, each callable
    taking ``inputs`` (``input_ids``, ``cache_position``) and returning the next token ids (argmax of the
    last position's logits). Prefill: the prompt of the bucket's full length (its median is the time to
    first token); decode: one token at position ``max_seq_len // 2`` (its median is the per-token decode
    latency; ``batch`` tokens per call); an NxDI target: ``generate(max_new_tokens=1)`` through NxDI's adapter on
    a prompt of the longest context bucket (time to first token). The eager side is transformers'
    static-cache wrapper of the eager model in the target dtype, uncompiled: the same work without the
    compiler.

    The compiled side is loaded as serving and validation load it
    (:func:`neuron_build.compilers.textgen_load.load_next_token`).

    Raises:
        UserError: an NxDI target on a host without a NeuronCore (one line naming the host it needs); a
            backend with no text-generation serving engine (:class:`~neuron_build.compilers.textgen_load.NoTextGenEngine`)."""
    import torch

    from neuron_build.compilers.textgen import causal_lm, graph_inputs, static_wrapper
    from neuron_build.compilers.textgen_load import load_next_token
    from neuron_build.examples import build_model

    spec = project.config.models[target.model]
    sizes = dict(target.bucket)
    b, L = sizes["batch"], int(spec.max_seq_len)
    nxdi = target.graph == "nxdi"  # timed as its prefill: the longest context bucket, one new token
    seq = max(spec.buckets.get("seq") or [1]) if nxdi else sizes.get("seq")
    kw = graph_inputs("prefill" if nxdi else target.graph, b, seq if nxdi or target.graph == "prefill" else L // 2)
    kw["input_ids"] = torch.randint(3, 100, tuple(kw["input_ids"].shape), generator=torch.Generator().manual_seed(0))
    compiled = load_next_token(textgen_source(project, store, target, [(target, key, manifest)]))
    ref = static_wrapper(causal_lm(build_model(project.root, spec.factory, dict(spec.kwargs), target.dtype,
                                               hf=spec.hf_spec())), b, L)

    def eager(ids, pos):
        return ref(input_ids=ids, cache_position=pos)[:, -1].argmax(-1)

    return compiled, eager, (kw["input_ids"], kw["cache_position"])


__all__ = ["ReferenceFailed", "bench_callables", "judge_tokens", "partners", "textgen_source", "validate_textgen"]
