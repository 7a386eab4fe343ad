"""Greedy generation from compiled prefill and decode graphs (:mod:`neuron_build.compilers.textgen`).

:class:`TextGenEngine` holds, per batch size, the prefill graphs (one per seq bucket), the decode graph
and **one** KV state they share. ``generate`` is greedy decoding, equal token for token to transformers'
``generate(do_sample=False)`` of the eager model in fp32 [measured: shared notes 2.1, and the tests]:

1. Each row's prompt is its tokens where ``attention_mask`` is 1 (all of them without a mask; a row's
   real tokens must be contiguous: left or right padding). Rows are grouped by prompt length, since the
   graphs take one ``cache_position`` for the whole batch.
2. A group runs in chunks of the largest batch size (a chunk smaller than every batch bucket it fits is
   padded with copies of its first row, whose outputs are dropped), in the smallest prefill bucket whose
   ``seq`` holds the prompt: the prompt is right-padded with token 0 to ``seq`` (pad positions are masked by
   position and later overwritten by the decode steps).
3. The state is zeroed, prefill runs at positions ``0..seq-1`` and the first new token is the argmax of the
   logits at the prompt's last position; each decode step feeds the last token at position ``n``,
   ``n+1``, ... (``n`` = the prompt length; transformers' own exportable ``generate`` helper skips a slot
   here and diverges [measured]).
4. With ``eos_token_id`` (a token id or a list of them), a row that produced one gets the pad token from then
   on, and generation stops when every row has, as transformers does: the pad token is ``pad_token_id``, else
   the model's (its ``generation_config.pad_token_id``, recorded at compile time in ``textgen.json``), else
   the first eos id. Without ``eos_token_id``, exactly ``max_new_tokens`` are generated (transformers would
   stop at the model's own eos: pass it to do the same).

**Requests are checked before any graph runs** (a compiled graph's own index check aborts the process
[measured: issue 30]): ``input_ids`` a 2-D integer tensor with at least one token per row, every id in the
vocabulary ``[0, vocab_size)``; ``attention_mask`` of its shape holding 0 and 1 only; ``max_new_tokens`` a
whole number >= 1; ``eos_token_id`` and ``pad_token_id`` whole numbers; the prompt and the new tokens within
the KV cache. A violation is one :class:`GenerateError`; transformers raises on the same requests.

**Thread-safe**: the graphs of one batch size share one KV state, so a whole generation (reset, prefill,
decode steps) holds that batch size's lock (:attr:`GraphSet.lock`); calls in other batch sizes run at once.

The result is ``input_ids`` (as given, padding included) followed by the new tokens: ``[batch,
prompt_len + new]`` int64, like transformers' ``generate``. Nothing compiles here: AOTInductor graphs are
loaded, compile-cache graphs hit the installed caches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError


class GenerateError(UserError):
    """A request the compiled graphs cannot serve (a malformed request, an id outside the vocabulary, a prompt
    longer than every bucket, more tokens than the KV cache holds); one line with the fix."""


@dataclass
class GraphSet:
    """The graphs of one batch size: ``prefill`` seq -> callable, ``decode`` callable, ``reset`` zeroing
    their shared KV state, ``lock`` held by whoever uses that state. Callables take ``input_ids`` and
    ``cache_position`` keywords, return logits."""

    batch: int
    prefill: dict[int, Callable[..., Any]] = field(default_factory=dict)
    decode: Callable[..., Any] | None = None
    reset: Callable[[], None] = lambda: None
    lock: Any = field(default_factory=threading.Lock)


def _dtype(name: str):
    import torch
    return getattr(torch, name)


class AOTIStates:
    """Loads AOTInductor text-generation graphs and shares weights (once per weights file content) and a
    KV state (once per batch size) between them through ``load_constants(..., user_managed=True)``."""

    def __init__(self) -> None:
        self.weights: dict[str, dict[str, Any]] = {}
        self.states: dict[int, dict[str, Any]] = {}

    def state(self, batch: int, spec: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        if batch not in self.states:
            self.states[batch] = {s["name"]: torch.zeros(s["shape"], dtype=_dtype(s["dtype"])) for s in spec}
        return self.states[batch]

    def load(self, package: Path, weights: Path, weights_id: str, info: dict[str, Any], folder: Path | None = None):
        """Load ``package`` (a ``.pt2``) and give it the weights of ``weights`` (read once per
        ``weights_id``, e.g. the file's sha256) and the KV state of its batch size. A graph compiled with
        ``weights = "external"`` (``weights.json`` in its ``folder``) has the weights file checked against that
        spec (names, dtypes, shapes, from the file's header) and its ``get_constant_fqns()`` against the spec
        and the state **before** any constant is loaded: such a package validates nothing (a wrong shape
        corrupts the heap) [measured: shared/weights-and-real-hlo.md 3.4].

        Raises:
            UserError: the weights do not fit the spec, or the package needs a constant that neither the
                weights nor the state hold (one line naming the file and the fix).
        """
        import torch
        from safetensors.torch import load_file

        from neuron_build.compilers import weights as external

        spec = self._spec(folder, weights)
        runner = torch._inductor.aoti_load_package(str(package))
        state = self.state(int(info["batch"]), info["state"])
        fqns = list(runner.get_constant_fqns())
        if spec is not None:
            why = external.uncovered(fqns, {**spec, **state})
            if why is not None:
                raise UserError(f"{package}: {why}; rebuild the artifact")
        if weights_id not in self.weights:
            self.weights[weights_id] = load_file(str(weights))
        have = {**self.weights[weights_id], **state}
        missing = [f for f in fqns if f not in have]
        if missing:
            raise UserError(f"{package}: its graph needs constants {', '.join(missing[:5])} that {weights.name} "
                            f"does not hold; pull the release again")
        runner.load_constants({f: have[f] for f in fqns}, check_full_update=False, user_managed=True)
        return runner

    @staticmethod
    def _spec(folder: Path | None, weights: Path) -> dict[str, Any] | None:
        """``folder``'s weights spec (None: none), ``weights`` checked against it (else UserError)."""
        from neuron_build.compilers import weights as external

        why = None if folder is None else external.problem(folder, weights)  # (an unreadable spec too)
        if why is not None:
            raise UserError(why)
        return None if folder is None else external.read_spec(folder)

    def reset(self, batch: int) -> Callable[[], None]:
        def zero() -> None:
            for t in self.states.get(batch, {}).values():
                t.zero_()
        return zero


class TextGenEngine:
    """Greedy generation over compiled graphs (see the module docstring).

    Args:
        groups: batch size -> :class:`GraphSet` (each with a decode graph and at least one prefill graph).
        max_seq_len: the KV cache length in tokens.
        name: the model's name, for messages.
        vocab_size: ids are checked against ``[0, vocab_size)``; None: learnt from the logits of one prefill
            call on token 0 (artifacts that do not record it).
        generation: the model's generation settings (``pad_token_id``), None when not recorded (then an
            ``eos_token_id`` needs an explicit ``pad_token_id``).
    """

    def __init__(self, groups: dict[int, GraphSet], max_seq_len: int, name: str = "model",
                 vocab_size: int | None = None, generation: dict[str, Any] | None = None):
        self.groups = dict(sorted(groups.items()))
        self.max_seq_len = int(max_seq_len)
        self.name = name
        self.generation = generation
        self.seqs = sorted({s for g in self.groups.values() for s in g.prefill})
        for b, g in self.groups.items():
            if g.decode is None or not g.prefill:
                raise UserError(f"{name}: batch size {b} has {'no decode graph' if g.decode is None else 'no prefill graph'};"
                                f" release both graphs of every bucket")
        #: Token ids are in ``[0, vocab_size)``.
        self.vocab_size = int(vocab_size) if vocab_size is not None else self._probe_vocab()

    def _probe_vocab(self) -> int:
        """The logits' last dim of one prefill call on token 0 (the smallest graph), the state reset after."""
        import torch

        g = next(iter(self.groups.values()))
        s = min(g.prefill)
        with g.lock, torch.no_grad():
            g.reset()
            logits = g.prefill[s](input_ids=torch.zeros(g.batch, s, dtype=torch.long), cache_position=torch.arange(s))
            g.reset()
        return int(logits.shape[-1])

    # -- routing ------------------------------------------------------------------------------------
    def prefill_bucket(self, batch: int, n: int) -> int:
        """The smallest prefill ``seq`` of batch size ``batch`` that holds a prompt of ``n`` tokens.

        Raises:
            GenerateError: the prompt is longer than every prefill bucket.
        """
        fits = [s for s in sorted(self.groups[batch].prefill) if s >= n]
        if not fits:
            raise GenerateError(
                f"a prompt of {n} tokens is longer than every prefill bucket of {self.name} (seq = {self.seqs}); "
                f"add a seq bucket >= {n} (below max_seq_len = {self.max_seq_len}) to [models.{self.name}] "
                f"buckets in buckets.toml, then build, release, promote and pull again")
        return fits[0]

    def chunks(self, rows: int) -> list[tuple[int, int]]:
        """(rows, batch bucket) per chunk: chunks of the largest batch size, each in the smallest batch
        bucket that holds it."""
        top = max(self.groups)
        sizes = [top] * (rows // top) + ([rows % top] if rows % top else [])
        return [(k, min(b for b in self.groups if b >= k)) for k in sizes]

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None):
        """Greedy generation (module docstring).

        Args:
            input_ids: integer ``[batch, prompt_len]`` (any integer dtype; ids in ``[0, vocab_size)``).
            attention_mask: optional ``[batch, prompt_len]`` of 0/1 (left or right padding).
            max_new_tokens: new tokens per row (a whole number, at least 1).
            eos_token_id: stop a row at this token, or at any of a list (then padded); None: never stop early.
            pad_token_id: what finished rows get; None: the model's, else the first eos id (as transformers).

        Returns:
            int64 ``[batch, prompt_len + new]``: ``input_ids`` then the new tokens.

        Raises:
            GenerateError: a malformed request (see the module docstring), a prompt longer than every bucket,
                or more tokens than the KV cache holds. Nothing has run then.
        """
        import torch

        ids = self._check_ids(input_ids)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral) or max_new_tokens < 1:
            raise GenerateError(f"max_new_tokens is {max_new_tokens!r}; give a whole number >= 1")
        max_new_tokens = int(max_new_tokens)
        eos = _token_list("eos_token_id", eos_token_id)
        pad = self._pad(eos, pad_token_id)
        prompts = self._prompts(ids, attention_mask)
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(i)
        for n, rows in sorted(by_len.items()):
            self.check_length(n, max_new_tokens, {bb for _k, bb in self.chunks(len(rows))})
        new: list[list[int]] = [[] for _ in prompts]
        for _n, rows in sorted(by_len.items()):
            start = 0
            for k, bb in self.chunks(len(rows)):
                part = rows[start:start + k]
                start += k
                toks = torch.stack([prompts[i] for i in part] + [prompts[part[0]]] * (bb - k))
                out = self._run(self.groups[bb], toks, max_new_tokens, eos, pad)
                for j, i in enumerate(part):
                    new[i] = out[j]
        longest = max(len(t) for t in new)
        tail = torch.tensor([t + [pad] * (longest - len(t)) for t in new], dtype=torch.long)
        return torch.cat([ids, tail], dim=1)

    def check_length(self, n: int, max_new_tokens: int, batches: Sequence[int] | set[int] = ()) -> None:
        """A prompt of ``n`` tokens and ``max_new_tokens`` new ones fit a prefill bucket of each batch size in
        ``batches`` (those its rows run in; empty: every batch size) and the KV cache.

        Raises:
            GenerateError: with the advice that fits: a shorter prompt or a larger ``max_seq_len`` when the
                prompt leaves no room for a new token, a seq bucket when no prefill bucket holds it, fewer
                new tokens when they overflow the cache.
        """
        if n >= self.max_seq_len:
            raise GenerateError(
                f"a prompt of {n} tokens does not fit the KV cache of {self.name} (max_seq_len = {self.max_seq_len}) "
                f"with a new token; give at most {self.max_seq_len - 1} prompt tokens, or raise max_seq_len in "
                f"[models.{self.name}] above {n + 1} and add a seq bucket >= {n}, then build, release, promote and "
                f"pull again")
        for b in sorted(batches) or self.groups:
            self.prefill_bucket(b, n)
        if n + max_new_tokens > self.max_seq_len:
            raise GenerateError(
                f"a prompt of {n} tokens plus max_new_tokens = {max_new_tokens} exceeds the KV cache of "
                f"{self.name} (max_seq_len = {self.max_seq_len}); ask for at most {self.max_seq_len - n} "
                f"new tokens, or raise max_seq_len in [models.{self.name}] and rebuild")

    def _check_ids(self, input_ids):
        """``input_ids`` as an int64 CPU tensor, checked: 2-D, integer, non-empty, in the vocabulary."""
        import torch

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            got = list(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise GenerateError(f"input_ids must be a 2-D torch.Tensor [batch, prompt_len] of token ids; got {got}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise GenerateError(f"input_ids is {input_ids.dtype}; token ids are integers (torch.long)")
        if input_ids.numel() == 0:
            raise GenerateError(f"input_ids has no tokens (shape {list(input_ids.shape)}); give at least one token "
                                f"per row")
        ids = input_ids.to(torch.long).cpu()
        lo, hi = torch.aminmax(ids)
        if int(lo) < 0 or int(hi) >= self.vocab_size:
            bad = (ids < 0) | (ids >= self.vocab_size)
            at = [int(i) for i in bad.nonzero()[0]]
            raise GenerateError(f"input_ids holds {int(ids[tuple(at)])} at {at}; {self.name}'s vocabulary is ids 0 "
                                f"to {self.vocab_size - 1}")
        return ids

    def _pad(self, eos: list[int] | None, pad_token_id: Any) -> int:
        """The token finished rows get: ``pad_token_id``, else the model's, else the first eos id (0 without
        eos: no row finishes early then). Finished rows feed it to the decode graph, so with ``eos`` it must be
        in the vocabulary (a compiled embedding's bounds check aborts the process, not raises)."""
        if pad_token_id is None and not eos:
            return 0
        pad = self._given_pad(eos, pad_token_id)
        if eos and pad >= self.vocab_size:
            raise GenerateError(f"the pad token of finished rows is {pad} (pad_token_id, else the model's, else the "
                                f"first eos id); they feed it to the decode graph, and {self.name}'s vocabulary is ids "
                                f"0 to {self.vocab_size - 1}: pass pad_token_id= in it")
        return pad

    def _given_pad(self, eos: list[int] | None, pad_token_id: Any) -> int:
        if pad_token_id is not None:
            return _token_list("pad_token_id", [pad_token_id])[0]
        if self.generation is None:
            raise GenerateError(f"the release of {self.name} does not record the model's pad_token_id (its graphs were "
                                f"built before it was recorded): pass pad_token_id= (the token finished rows get) "
                                f"with eos_token_id")
        model_pad = self.generation.get("pad_token_id")
        return int(model_pad) if model_pad is not None else eos[0]

    def _prompts(self, ids, mask) -> list:
        import torch

        if mask is None:
            return [row for row in ids]
        mask = torch.as_tensor(mask).cpu()
        if tuple(mask.shape) != tuple(ids.shape):
            raise GenerateError(f"attention_mask has shape {list(mask.shape)}; it must match input_ids "
                                f"{list(ids.shape)}")
        if mask.is_floating_point() or mask.is_complex() or bool(((mask != 0) & (mask != 1)).any()):
            bad = (mask != 0) & (mask != 1)
            if not bool(bad.any()):
                raise GenerateError(f"attention_mask is {mask.dtype}; give 0/1 integers (torch.long)")
            at = [int(i) for i in bad.nonzero()[0]]
            raise GenerateError(f"attention_mask holds {mask[tuple(at)].item()} at {at}; it takes 0 (padding) and 1 "
                                f"(tokens)")
        out = []
        for r in range(ids.shape[0]):
            where = torch.nonzero(mask[r]).flatten()
            if where.numel() == 0:
                raise GenerateError(f"row {r} of attention_mask is all zeros; every row needs a prompt")
            lo, hi = int(where[0]), int(where[-1]) + 1
            if int(mask[r, lo:hi].sum()) != hi - lo:
                raise GenerateError(f"row {r} of attention_mask has holes; pad on the left or the right only")
            out.append(ids[r, lo:hi])
        return out

    def _run(self, g: GraphSet, toks, max_new: int, eos: list[int] | None, pad: int) -> list[list[int]]:
        """One chunk of prompts of one length through batch size ``g``'s graphs, holding its lock (its KV
        state) from the reset to the last decode step."""
        import torch

        rows, n = toks.shape
        s = self.prefill_bucket(g.batch, n)
        x = torch.zeros(rows, s, dtype=torch.long)
        x[:, :n] = toks
        stops = torch.tensor(eos or [], dtype=torch.long)
        with g.lock, torch.no_grad():
            g.reset()
            logits = g.prefill[s](input_ids=x, cache_position=torch.arange(s))
            tok = logits[:, n - 1].argmax(-1)
            done = torch.zeros(rows, dtype=torch.bool)
            out = []
            for step in range(max_new):
                if eos:
                    tok = torch.where(done, torch.full_like(tok, pad), tok)
                    done = done | torch.isin(tok, stops)
                out.append(tok)
                if step == max_new - 1 or (eos and bool(done.all())):
                    break
                logits = g.decode(input_ids=tok[:, None], cache_position=torch.tensor([n + step]))
                tok = logits[:, -1].argmax(-1)
        return torch.stack(out, 1).tolist()

    def first_logits(self, tokens) -> Any:
        """fp32 logits of the first new token for prompts of one length (``[rows, prompt_len]`` int64; rows
        at most the largest batch size): ``[rows, vocab]``. For validation's logits error."""
        import torch

        rows, n = tokens.shape
        bb = min(b for b in self.groups if b >= rows)
        g = self.groups[bb]
        s = self.prefill_bucket(bb, n)
        x = torch.zeros(bb, s, dtype=torch.long)
        x[:rows, :n] = tokens
        with g.lock, torch.no_grad():
            g.reset()
            logits = g.prefill[s](input_ids=x, cache_position=torch.arange(s))
            g.reset()
        return logits[:rows, n - 1].float()

    def forced_logits(self, prompt, forced) -> Any:
        """fp32 logits of every new-token position when the new tokens are ``forced`` (teacher forcing: each
        decode step is fed the given token, not the graph's own argmax), for validation that continues from
        the reference's token after a tie.

        Args:
            prompt: int64 ``[rows, n]``, prompts of one length (rows at most the largest batch size).
            forced: int64 ``[rows, k]``, the new tokens to feed (the last one is not fed).

        Returns:
            fp32 ``[rows, k, vocab]``: position 0 from prefill (the prompt's last position), position ``i``
            from the decode step fed ``forced[:, i - 1]`` at cache position ``n + i - 1``.

        Raises:
            GenerateError: the prompt is longer than every bucket, or ``n + k`` exceeds the KV cache.
        """
        import torch

        rows, n = prompt.shape
        k = int(forced.shape[1])
        if n + k > self.max_seq_len:
            raise GenerateError(f"a prompt of {n} tokens plus {k} forced tokens exceeds the KV cache of {self.name} "
                                f"(max_seq_len = {self.max_seq_len})")
        bb = min(b for b in self.groups if b >= rows)
        g = self.groups[bb]
        s = self.prefill_bucket(bb, n)
        x = torch.zeros(bb, s, dtype=torch.long)
        x[:rows, :n] = prompt
        feed = torch.zeros(bb, k, dtype=torch.long)
        feed[:rows] = forced
        with g.lock, torch.no_grad():
            g.reset()
            out = [g.prefill[s](input_ids=x, cache_position=torch.arange(s))[:, n - 1].float()]
            for i in range(1, k):
                # contiguous: a compiled graph reads its input by the strides it was traced with
                logits = g.decode(input_ids=feed[:, i - 1:i].contiguous(), cache_position=torch.tensor([n + i - 1]))
                out.append(logits[:, -1].float())
            g.reset()
        return torch.stack(out, 1)[:rows]


def _token_list(what: str, value: Any) -> list[int] | None:
    """``eos_token_id`` or ``pad_token_id`` as a list of ints (None stays None; a tensor or a list gives its
    elements).

    Raises:
        GenerateError: an element is not a whole number >= 0.
    """
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for v in items:
        if isinstance(v, bool) or not isinstance(v, Integral) or v < 0:
            raise GenerateError(f"{what} holds {v!r}; give a token id or a list of them")
    return [int(v) for v in items] or None


def aoti_engine(graphs: Sequence[tuple[dict[str, Any], Path, Path, str, Path | None]], max_seq_len: int,
                name: str) -> TextGenEngine:
    """An engine over AOTInductor graphs.

    Args:
        graphs: per graph ``(textgen info, model.pt2 path, weights.safetensors path, weights id, folder)``;
            the info is the artifact's ``textgen.json`` (graph, batch, seq, state; ``vocab_size`` and
            ``generation`` when the compiler recorded them); ``folder`` holds its ``weights.json`` when it
            was compiled with external weights (:meth:`AOTIStates.load` checks the weights against it).
    """
    states = AOTIStates()
    groups: dict[int, GraphSet] = {}
    infos = [g[0] for g in graphs]
    vocab = {i.get("vocab_size") for i in infos}
    gen = [i.get("generation") for i in infos]
    for info, package, weights, wid, folder in graphs:
        b = int(info["batch"])
        g = groups.setdefault(b, GraphSet(b, reset=states.reset(b)))
        runner = states.load(package, weights, wid, info, folder)
        if info["graph"] == "prefill":
            g.prefill[int(info["seq"])] = runner
        else:
            g.decode = runner
    # every graph must record the same facts, else they are learnt (vocabulary) or asked for (pad token)
    return TextGenEngine(groups, max_seq_len, name, vocab_size=vocab.pop() if len(vocab) == 1 else None,
                         generation=gen[0] if gen and all(x == gen[0] for x in gen) else None)


def compiled_engine(lm, batches: Sequence[int], seqs: Sequence[int], max_seq_len: int, compile_kwargs: dict,
                    name: str) -> TextGenEngine:
    """An engine over ``torch.compile`` of transformers' static-cache wrapper of ``lm``, one per batch size
    (its buffers are the KV state its prefill and decode calls share); call after the caches are installed
    (:func:`neuron_build.compilers.compile_cache.install_from_caches`) so that every graph is a cache hit."""
    import torch

    from neuron_build.compilers.textgen import generation_settings, reset_state, static_wrapper

    groups = {}
    for b in sorted(set(batches)):
        w = static_wrapper(lm, b, max_seq_len)
        fn = torch.compile(w, **compile_kwargs)
        groups[b] = GraphSet(b, prefill={s: fn for s in seqs}, decode=fn, reset=lambda w=w: reset_state(w))
    return TextGenEngine(groups, max_seq_len, name, vocab_size=lm.get_input_embeddings().num_embeddings,
                         generation=generation_settings(lm))


__all__ = ["AOTIStates", "GenerateError", "GraphSet", "TextGenEngine", "aoti_engine", "compiled_engine"]
