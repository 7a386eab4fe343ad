"""TextGenEngine's request checks, eos/pad rules and thread safety, over plain callables standing in for the
compiled graphs (no compile): a toy LM whose next token depends on every token so far through a KV-like state
shared by the prefill and decode graphs of one batch size, as the compiled graphs share theirs. Equality with
transformers on real graphs: tests/flows/test_serving.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from neuron_build.compilers.textgen_serve import GenerateError, GraphSet, TextGenEngine

VOCAB = 50


def next_token(history: list[int]) -> int:
    """The toy LM's greedy choice after ``history``."""
    return (sum((i + 1) * t for i, t in enumerate(history)) * 7 + 3) % VOCAB


class ToyGraphs:
    """Prefill and decode of one batch size over one state (the tokens so far, per row); each graph call
    reads the state, yields the GIL, then writes it back, as a compiled kernel updating a KV cache does."""

    def __init__(self, batch: int):
        self.batch = batch
        self.state = [[] for _ in range(batch)]

    def reset(self) -> None:
        self.state = [[] for _ in range(self.batch)]

    def _logits(self, rows: list[list[int]], width: int):
        out = torch.zeros(len(rows), width, VOCAB)
        for r, hist in enumerate(rows):
            for j in range(width):
                out[r, j, next_token(hist[:len(hist) - width + j + 1])] = 1.0
        return out

    def prefill(self, input_ids, cache_position):
        rows = [list(map(int, row)) for row in input_ids]
        time.sleep(0.002)
        self.state = rows
        return self._logits(rows, input_ids.shape[1])

    def decode(self, input_ids, cache_position):
        state = self.state
        time.sleep(0.002)
        rows = []
        for r, hist in enumerate(state):
            pos = int(cache_position[0])
            rows.append(hist[:pos] + [int(input_ids[r, 0])])
        self.state = rows
        return self._logits(rows, 1)


def engine(batches=(2,), seqs=(8,), max_seq_len=32, generation=None, vocab_size=VOCAB) -> TextGenEngine:
    groups = {}
    for b in batches:
        t = ToyGraphs(b)
        groups[b] = GraphSet(b, prefill={s: t.prefill for s in seqs}, decode=t.decode, reset=t.reset)
    return TextGenEngine(groups, max_seq_len, "toy", vocab_size=vocab_size,
                         generation={"pad_token_id": 0, "eos_token_id": 2} if generation is None else generation)


def reference(prompt: list[int], new: int, eos: list[int] | None = None, pad: int = 0) -> list[int]:
    """Greedy decoding of the toy LM, written out: transformers' rule for finished rows."""
    hist, out, done = list(prompt), [], False
    for _ in range(new):
        t = pad if done else next_token(hist)
        out.append(t)
        hist.append(t)
        done = done or (eos is not None and t in eos)
    return out


def test_the_toy_engine_generates_as_written_out():
    eng = engine()
    ids = torch.tensor([[5, 6, 7], [9, 4, 1]])
    got = eng.generate(ids, max_new_tokens=6)
    assert got[:, 3:].tolist() == [reference([5, 6, 7], 6), reference([9, 4, 1], 6)]


def test_finished_rows_get_the_models_pad_token_and_eos_lists_stop():
    eng = engine()
    a, b = [5, 6, 7], [9, 4, 1]
    free_b = reference(b, 8)
    eos = next(t for t in free_b[1:] if t not in reference(a, 8) and t not in free_b[:1])
    got = eng.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=eos)
    assert got[1, 3:].tolist() == reference(b, 8, [eos], pad=0)  # padded with the model's pad_token_id 0
    assert got[0, 3:].tolist() == reference(a, 8, [eos])
    assert 0 in got[1, 3:].tolist() and eos in got[1, 3:].tolist()
    other = 49 if eos != 49 else 48
    assert torch.equal(eng.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=[other, eos]),
                       eng.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=torch.tensor([eos, other])))
    got = eng.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=eos, pad_token_id=11)
    assert got[1, 3:].tolist() == reference(b, 8, [eos], pad=11)
    # a model without a pad token pads with the first eos id, as transformers does
    nopad = engine(generation={"pad_token_id": None, "eos_token_id": 2})
    got = nopad.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=[eos, other])
    assert got[1, 3:].tolist() == reference(b, 8, [eos, other], pad=eos)
    # a release that does not record the model's pad token: asked for, not guessed
    unknown = TextGenEngine({2: engine().groups[2]}, 32, "toy", vocab_size=VOCAB, generation=None)
    with pytest.raises(GenerateError, match=r"does not record the model's pad_token_id \(.*\): pass pad_token_id="):
        unknown.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=eos)
    assert unknown.generate(torch.tensor([a, b]), max_new_tokens=8, eos_token_id=eos, pad_token_id=0)[1, 3:].tolist() \
        == reference(b, 8, [eos])


@pytest.mark.parametrize("ids,kw,message", [
    (torch.tensor([[5, 50, 7]]), {}, r"input_ids holds 50 at \[0, 1\]; toy's vocabulary is ids 0 to 49"),
    (torch.tensor([[5, 6], [7, -3]]), {}, r"input_ids holds -3 at \[1, 1\]; toy's vocabulary is ids 0 to 49"),
    (torch.tensor([[3.7, 5.0]]), {}, r"input_ids is torch.float32; token ids are integers"),
    (torch.tensor([[True]]), {}, r"input_ids is torch.bool; token ids are integers"),
    (torch.zeros(1, 0, dtype=torch.long), {}, r"input_ids has no tokens \(shape \[1, 0\]\)"),
    (torch.zeros(0, 3, dtype=torch.long), {}, r"input_ids has no tokens \(shape \[0, 3\]\)"),
    (torch.tensor([5, 6]), {}, r"input_ids must be a 2-D torch.Tensor \[batch, prompt_len\] of token ids; got \[2\]"),
    ([[5, 6]], {}, r"input_ids must be a 2-D torch.Tensor .*; got list"),
    (torch.tensor([[5, 6]]), {"max_new_tokens": 2.5}, r"max_new_tokens is 2.5; give a whole number >= 1"),
    (torch.tensor([[5, 6]]), {"max_new_tokens": 0}, r"max_new_tokens is 0; give a whole number >= 1"),
    (torch.tensor([[5, 6]]), {"max_new_tokens": True}, r"max_new_tokens is True; give a whole number >= 1"),
    (torch.tensor([[5, 6]]), {"eos_token_id": [2, 1.5]}, r"eos_token_id holds 1.5; give a token id or a list"),
    (torch.tensor([[5, 6]]), {"eos_token_id": 2, "pad_token_id": -1}, r"pad_token_id holds -1"),
    # a finished row's pad token is fed to the decode graph: out of the vocabulary, a compiled embedding aborts
    (torch.tensor([[5, 6]]), {"eos_token_id": 2, "pad_token_id": 50},
     r"^the pad token of finished rows is 50 \(pad_token_id, .*\); they feed it to the decode graph, and toy's "
     r"vocabulary is ids 0 to 49: pass pad_token_id= in it$"),
    (torch.tensor([[5, 6]]), {"attention_mask": torch.tensor([[1, 2]])},
     r"attention_mask holds 2 at \[0, 1\]; it takes 0 \(padding\) and 1 \(tokens\)"),
    (torch.tensor([[5, 6]]), {"attention_mask": torch.tensor([[0.5, 1.0]])}, r"attention_mask holds 0.5 at \[0, 0\]"),
    (torch.ones(1, 40, dtype=torch.long), {},
     r"^a prompt of 40 tokens does not fit the KV cache of toy \(max_seq_len = 32\) with a new token; give at most "
     r"31 prompt tokens, or raise max_seq_len in \[models.toy\] above 41 and add a seq bucket >= 40, then build"),
    (torch.ones(1, 9, dtype=torch.long), {}, r"^a prompt of 9 tokens is longer than every prefill bucket of toy"),
    (torch.ones(1, 8, dtype=torch.long), {"max_new_tokens": 30}, r"ask for at most 24 new tokens"),
])
def test_a_bad_request_is_one_line_and_runs_nothing(ids, kw, message):
    eng = engine()
    calls = []
    g = eng.groups[2]
    run = g.prefill[8]

    def counted(**a):
        calls.append(1)
        return run(**a)
    g.prefill = {8: counted}
    with pytest.raises(GenerateError, match=message) as e:
        eng.generate(ids, **{"max_new_tokens": 2, **kw})
    assert "\n" not in str(e.value) and calls == []
    assert eng.generate(torch.tensor([[5, 6]]), max_new_tokens=2)[0, 2:].tolist() == reference([5, 6], 2)


def test_a_recorded_pad_token_outside_the_vocabulary_is_refused_before_any_graph_runs():
    eng = engine(generation={"pad_token_id": VOCAB + 3, "eos_token_id": 2})
    with pytest.raises(GenerateError, match=rf"^the pad token of finished rows is {VOCAB + 3} "):
        eng.generate(torch.tensor([[5, 6]]), max_new_tokens=2, eos_token_id=2)
    # without eos no row finishes early, so no pad token is fed; with a good one given, it is used
    assert eng.generate(torch.tensor([[5, 6]]), max_new_tokens=2)[0, 2:].tolist() == reference([5, 6], 2)
    assert eng.generate(torch.tensor([[5, 6]]), max_new_tokens=2, eos_token_id=2, pad_token_id=0)[0, 2:].tolist() \
        == reference([5, 6], 2, [2], pad=0)


def test_the_vocabulary_is_learnt_from_the_logits_when_not_recorded():
    eng = engine(vocab_size=None)
    assert eng.vocab_size == VOCAB
    with pytest.raises(GenerateError, match="vocabulary is ids 0 to 49"):
        eng.generate(torch.tensor([[VOCAB]]), max_new_tokens=1)


def test_two_threads_each_get_their_own_answer():
    """Both threads use the one state of batch size 2: without the lock their graph calls interleave."""
    eng = engine()
    prompts = [torch.tensor([[5, 6, 7]]), torch.tensor([[9, 4, 1, 8]])]
    expected = [reference(p[0].tolist(), 10) for p in prompts]
    wrong: list[tuple[int, int]] = []

    def serve(k: int) -> None:
        for i in range(4):
            got = eng.generate(prompts[k], max_new_tokens=10)[0, prompts[k].shape[1]:].tolist()
            if got != expected[k]:
                wrong.append((k, i))
    threads = [threading.Thread(target=serve, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_a_prompt_is_checked_against_the_batch_sizes_it_runs_in():
    """Batch size 1 has seq 8 and 16, batch size 2 only 8: a 12-token prompt of one row runs (in batch 1);
    two rows of it run in batch 2, which cannot hold it."""
    t1, t2 = ToyGraphs(1), ToyGraphs(2)
    eng = TextGenEngine({1: GraphSet(1, prefill={8: t1.prefill, 16: t1.prefill}, decode=t1.decode, reset=t1.reset),
                         2: GraphSet(2, prefill={8: t2.prefill}, decode=t2.decode, reset=t2.reset)},
                        32, "toy", vocab_size=VOCAB, generation={"pad_token_id": 0})
    prompt = list(range(1, 13))
    assert eng.generate(torch.tensor([prompt]), max_new_tokens=3)[0, 12:].tolist() == reference(prompt, 3)
    with pytest.raises(GenerateError, match="a prompt of 12 tokens is longer than every prefill bucket of toy"):
        eng.generate(torch.tensor([prompt, prompt]), max_new_tokens=3)
