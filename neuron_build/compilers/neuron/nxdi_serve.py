"""Serving a pulled NxDI release (``backend = "neuron"``, text generation) with NxDI itself.

The call sequence [code: NxDI examples/generation_demo.py, utils/hf_adapter.py; hlo-before-neff notes 4]::

    app = NeuronLlamaForCausalLM(path)        # reads path/neuron_config.json
    app.load(path)                            # model.pt onto the NeuronCores (weights: see below)
    HuggingFaceGenerationAdapter(app).generate(input_ids, attention_mask=..., max_new_tokens=N, do_sample=False)

One application per pulled bucket folder (one NxDI compile per batch size). NxDI's ``load()`` reads
``weights/`` when the compile pre-sharded them (neuron-build's NxDI artifacts do), else the Hugging Face
checkpoint its config names (``_name_or_path``) [code: application_base.py; shared notes 1.1]; the shards are
checked against the artifact's spec (names, dtypes, shapes, from their headers) before anything is loaded
(:func:`neuron_build.compilers.neuron.nxdi_weights.serve_problem`). Everything here needs a NeuronCore:
without one, one line names the host the release needs (:func:`host_problem`). NxDI is imported lazily.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import CompileFailed
from neuron_build.compilers.neuron.nxdi import LOADER, model_classes
from neuron_build.runtime.pulled import PulledRelease


def is_nxdi_release(release: PulledRelease) -> bool:
    """Whether a pulled release holds NxDI artifacts (their recorded loader is :data:`LOADER`)."""
    return any(b.loader == LOADER for b in release.buckets)


def host_problem(model: str, backend: str, hardware_target: str | None, where: str,
                 tp_degree: int | None = None, cores: list[str] | None = None) -> str | None:
    """One line saying that this host cannot run an NxDI release (no NeuronCore: no ``/dev/neuron<N>``,
    :func:`neuron_build.project.toolchain.neuron_devices`) and what host it needs, or None.

    Args:
        model, backend, hardware_target: the release's (a pulled record's, or the compiled folders').
        where: names the release in the message (its folder's ``release.json``, or the target).
        tp_degree: the NeuronCores one copy of the model spans, when known.
        cores: the device nodes to judge by (default: this host's).
    """
    from neuron_build.project.toolchain import neuron_devices

    if cores is None:
        cores = neuron_devices()
    if cores:
        return None
    need = f" with at least {tp_degree} NeuronCores (tp_degree {tp_degree})" if tp_degree else ""
    hw = hardware_target
    return (f"{where}: an NxDI release of {model} (backend {backend}, {hw}) runs "
            f"only on a Neuron host and this host has no NeuronCore (no /dev/neuron*); serve, validate and "
            f"bench it on a {hw} instance{need}")


def pulled_tp_degree(release: PulledRelease, root: Path) -> int | None:
    """The largest ``tp_degree`` the bucket folders' ``neuron_config.json`` name (None: none readable)."""
    tps = []
    for b in release.buckets:
        try:
            tps.append(int(json.loads((root / b.id / "neuron_config.json").read_text())["neuron_config"]["tp_degree"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(tps) if tps else None


class NxDIEngine:
    """Greedy ``generate`` over loaded NxDI applications, one per batch size (a pulled bucket each), through
    NxDI's ``HuggingFaceGenerationAdapter`` [code: NxDI utils/hf_adapter.py; hlo-before-neff notes 4].

    A request's rows run in chunks of the largest batch size; a chunk smaller than the batch size of the
    application it runs on is filled with copies of its first row (with its mask), whose outputs are
    dropped. Each chunk is one ``adapter.generate(input_ids, attention_mask=..., max_new_tokens=N,
    do_sample=False, eos_token_id=...)`` (the adapter pads finished rows as transformers does with its
    generation config); without ``eos_token_id``, ``min_new_tokens = N`` makes every row generate exactly N
    tokens. When chunks stopped at different lengths, the shorter ones are padded to the longest with eos
    (else the model's ``pad_token_id``, else 0).

    Args:
        apps: batch size -> (application, adapter).
        max_seq_len: NxDI's ``seq_len`` (prompt plus new tokens).
        max_context: the largest context-encoding bucket (the longest prompt).
        pad_token_id: from the compiled ``neuron_config.json`` (the HF config's), or None.
    """

    def __init__(self, apps: dict[int, tuple[Any, Any]], name: str, max_seq_len: int, max_context: int,
                 pad_token_id: int | None = None):
        self.apps = dict(sorted(apps.items()))
        self.name, self.max_seq_len, self.max_context = name, int(max_seq_len), int(max_context)
        self.pad_token_id = pad_token_id

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20, eos_token_id: int | None = None):
        """As :meth:`neuron_build.compilers.textgen_serve.TextGenEngine.generate`: int64 ``[batch,
        prompt_len]`` (and its 0/1 mask) -> ``[batch, prompt_len + new]``.

        Raises:
            GenerateError: not a 2-D tensor, max_new_tokens < 1, a prompt longer than the largest
                context-encoding bucket, or more tokens than ``seq_len``.
        """
        import torch

        from neuron_build.compilers.textgen_serve import GenerateError

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise GenerateError("input_ids must be a 2-D tensor [batch, prompt_len] of token ids")
        if max_new_tokens < 1:
            raise GenerateError(f"max_new_tokens is {max_new_tokens}; give at least 1")
        rows, n = (int(x) for x in input_ids.shape)
        if n > self.max_context:
            raise GenerateError(f"a prompt of {n} tokens is longer than every context-encoding bucket of "
                                f"{self.name} (largest {self.max_context}); add a seq bucket >= {n} to "
                                f"[models.{self.name}] buckets in buckets.toml, then build, release, promote and "
                                f"pull again")
        if n + max_new_tokens > self.max_seq_len:
            raise GenerateError(f"a prompt of {n} tokens plus max_new_tokens = {max_new_tokens} exceeds seq_len "
                                f"{self.max_seq_len} of {self.name}; ask for at most {self.max_seq_len - n} new "
                                f"tokens, or raise max_seq_len in [models.{self.name}] and rebuild")
        ids = input_ids.to(torch.long).cpu()
        mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).to(torch.long).cpu()
        if tuple(mask.shape) != tuple(ids.shape):
            raise GenerateError(f"attention_mask has shape {list(mask.shape)}; it must match input_ids {list(ids.shape)}")
        top = max(self.apps)
        outs = []
        for start in range(0, rows, top):
            k = min(top, rows - start)
            bb = min(b for b in self.apps if b >= k)
            x, m = ids[start:start + k], mask[start:start + k]
            if bb > k:
                x = torch.cat([x, x[:1].expand(bb - k, -1)])
                m = torch.cat([m, m[:1].expand(bb - k, -1)])
            kw = {"eos_token_id": eos_token_id} if eos_token_id is not None else {"min_new_tokens": max_new_tokens}
            out = self.apps[bb][1].generate(x, attention_mask=m, max_new_tokens=max_new_tokens, do_sample=False, **kw)
            outs.append(out[:k, n:])
        longest = max(o.shape[1] for o in outs)
        fill = eos_token_id if eos_token_id is not None else (self.pad_token_id or 0)
        tail = torch.cat([torch.nn.functional.pad(o, (0, longest - o.shape[1]), value=fill) for o in outs])
        return torch.cat([ids, tail.to(torch.long)], dim=1)


def nxdi_engine(folders: list[Path], model: str, backend: str, hardware_target: str | None,
                where: str) -> NxDIEngine:
    """Load a pulled NxDI release: per bucket folder, NxDI's application class of the compiled model's
    ``model_type`` (:data:`MODEL_CLASSES`) as NxDI serves a compiled folder: ``Cls(path)`` (which reads
    ``neuron_config.json``), ``.load(path)`` (``model.pt`` onto the NeuronCores), then
    ``HuggingFaceGenerationAdapter(app)`` [code: NxDI examples/generation_demo.py; hlo-before-neff notes 4].

    Args:
        folders: the compiled folders (a pulled release's bucket folders; validation and bench load them
            from the store).
        model, backend, hardware_target: what they were compiled as (the host message).
        where: names what is loaded in messages (the pulled ``release.json``, or a target and key).

    Raises:
        UserError: this host has no NeuronCore (one line: what host the release needs, :func:`host_problem`);
            NxDI is not installed; a folder's sharded weights do not fit its spec (or it has none and the
            checkpoint folder it names is not here); a folder's ``neuron_config.json`` is unreadable or names an unknown model
            type.
    """
    from neuron_build.errors import UserError

    configs = []
    for folder in folders:
        cfg_file = folder / "neuron_config.json"
        try:
            cfg = json.loads(cfg_file.read_text())
            nc = cfg["neuron_config"]
            configs.append((folder, cfg, int(nc["batch_size"]), int(nc["seq_len"]),
                            int(nc.get("max_context_length") or nc["seq_len"]), int(nc.get("tp_degree") or 1)))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{cfg_file}: not NxDI's compiled configuration ({type(e).__name__}: {e}); it is "
                            f"one of the artifact's files (pull the release again, or `neuron-build verify`)") from None
    problem = host_problem(model, backend, hardware_target, where, max(c[5] for c in configs))
    if problem:
        raise UserError(problem)
    try:
        from neuronx_distributed_inference.utils.hf_adapter import HuggingFaceGenerationAdapter
    except ImportError as e:
        raise UserError(f"{where}: an NxDI release needs neuronx-distributed-inference on the serving host "
                        f"({e}); install it from the Neuron package index") from None
    from neuron_build.compilers.neuron.nxdi_weights import serve_problem

    for folder, cfg, *_ in configs:  # every folder's sharded weights checked before NxDI loads anything
        problem = serve_problem(folder, cfg)
        if problem:
            raise UserError(problem)
    apps: dict[int, tuple[Any, Any]] = {}
    for folder, cfg, batch, _seq, _ctx, _tp in configs:
        try:
            _cfg_cls, app_cls = model_classes(str(cfg.get("model_type", "")))
        except CompileFailed as e:
            raise UserError(f"{folder / 'neuron_config.json'}: {e.reason}") from None
        app = app_cls(str(folder))  # reads neuron_config.json
        app.load(str(folder))       # model.pt onto the NeuronCores
        apps[batch] = (app, HuggingFaceGenerationAdapter(app))
    pad = configs[0][1].get("pad_token_id")
    return NxDIEngine(apps, model, min(c[3] for c in configs),
                      min(c[4] for c in configs), pad if isinstance(pad, int) else None)


__all__ = ["NxDIEngine", "host_problem", "is_nxdi_release", "nxdi_engine", "pulled_tp_degree"]
