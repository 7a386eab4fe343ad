"""Text-generation validation judges tokens step by step, both sides fed the reference's tokens: a token
that differs where the reference's top-2 logits are a near-tie is a tie, not a failure (issue 29 item 8)."""

from __future__ import annotations

import torch

from neuron_build.evaluate.textgen_validate import judge_tokens


def _steps(*rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)  # [rows, steps, vocab]


def test_a_near_tie_is_a_tie_and_the_steps_after_it_are_still_judged():
    # step 1: the reference's top-2 are 4.0 and 4.0000001 (random weights): the compiled side picks the other
    ref = _steps([[0.0, 5.0, 1.0, 0.0], [0.0, 4.0, 4.0000001, 1.0], [3.0, 0.0, 0.0, 1.0]])
    got = _steps([[0.0, 5.0, 1.0, 0.0], [0.0, 4.0000002, 4.0, 1.0], [3.0, 0.0, 0.0, 1.0]])
    tokens = torch.tensor([[1, 2, 0]])
    r = judge_tokens(got, ref, tokens, tol=1e-4)
    assert r["tokens_equal"] is False and r["first_diff"] == 1 and r["ties"] == 1 and r["diverged"] == 0
    assert abs(r["margin"] - 1e-7 / 4.0000001) < 1e-8  # the gap relative to the largest logit


def test_a_clear_difference_is_no_tie_and_equal_tokens_have_no_margin():
    ref = _steps([[0.0, 5.0, 1.0, 0.0], [0.0, 4.0, 3.0, 1.0]])
    got = _steps([[0.0, 5.0, 1.0, 0.0], [0.0, 3.0, 4.0, 1.0]])
    tokens = torch.tensor([[1, 1]])
    r = judge_tokens(got, ref, tokens, tol=1e-4)
    assert (r["first_diff"], r["ties"], r["diverged"]) == (1, 0, 1)
    assert r["margin"] == 0.25  # (4 - 3) / 4: far above the tolerance
    # a token outside the reference's top-2 is never a tie, however close the top-2 are
    ref = _steps([[1.0, 1.0, 0.9, 0.0]])
    got = _steps([[0.0, 0.0, 2.0, 0.0]])
    assert judge_tokens(got, ref, torch.tensor([[0]]), tol=1e-4)["diverged"] == 1
    same = judge_tokens(ref, ref, torch.tensor([[0]]), tol=1e-4)
    assert same == {"tokens_equal": True, "first_diff": None, "margin": None, "ties": 0, "diverged": 0}
