"""Text-generation graphs: prefill and decode of a transformers causal LM over one static KV cache.

A text-generation model (``task = "text-generation"`` in buckets.toml) is compiled as two kinds of graph,
each a target of its own (:mod:`neuron_build.project.matrix`):

- **prefill** at a bucket ``(batch, seq)``: ``input_ids`` int64 ``[batch, seq]`` (the prompt right-padded
  to ``seq``) and ``cache_position`` int64 ``[seq]`` (``0..seq-1``) -> logits ``[batch, seq, vocab]``; it
  writes the prompt's keys and values into the cache;
- **decode** at a batch size: ``input_ids`` ``[batch, 1]`` and ``cache_position`` ``[1]`` -> logits
  ``[batch, 1, vocab]``, one token against the whole cache.

Both are exported with transformers' own exportable wrapper,
``transformers.integrations.executorch.TorchExportableModuleWithStaticCache`` (a ``StaticCache`` of
``max_seq_len`` positions held as buffers ``key_cache_<i>``, ``value_cache_<i>``, ``cumulative_length_<i>``),
through ``torch.export.export(..., strict=True)``: with ``strict=False`` the cache's ``cumulative_length``
tensors are lifted as constants and AOTInductor fails on their mutation [measured: shared notes 2.3].
Pad slots of a right-padded prompt are masked by position and overwritten by the decode steps.

The **inductor** backend compiles each graph with AOTInductor to ``model.pt2`` *without* its weights
(``aot_inductor.package_constants_in_so = False``); the weights go to ``weights.safetensors`` beside it
(one tensor per FQN of the exported program, cloned, no metadata). Every graph of one model and dtype
writes byte-identical weights, and the store's CAS keeps a blob once by its sha256, so a release holds the
weights once however many graphs it pins. At load time the weights and the KV state are handed to each
graph with ``load_constants(..., user_managed=True)``: the prefill graphs of a batch size and its decode
graph share one state (:mod:`neuron_build.compilers.textgen_serve`), as NxD shares one state set per rank
across its submodels [code: shared notes 1.5].

The **compile-cache** backend warms ``torch.compile(wrapper, backend="inductor", fullgraph=True,
dynamic=False)`` on the graph's shapes and captures the caches as for other models
(:mod:`neuron_build.compilers.compile_cache`); serving rebuilds the wrapper from the recorded model and hits
them.

With the profile's ``weights = "external"`` (issue 38) the graphs are keyed by their **structure**
(:func:`structure_document`: the canonical graph, the weights and the KV state by name, dtype and shape,
the model's config, what ``textgen.json`` records), the package keeps every constant outside
(:data:`AOTI_CONFIG_EXTERNAL`) and the weights file is written with its spec (``weights.json``) before the
key is asked for: a fine-tune (new weight values, the same config) is relinked, not compiled
(:mod:`neuron_build.build.graph.relink`). Fails closed: a package whose ``get_constant_fqns()`` misses a weight
or a KV tensor (inlined into its kernels as literals) is recorded ``weights = "inline"`` and is never
relinked; weights that cannot be read or written compile with the key by value. With ``weights =
"inline"`` (the default) the key holds the weights by value, as before.

``textgen.json`` in each artifact records the graph, the bucket, ``max_seq_len``, the state's tensors
(name, shape, dtype) and the files. Torch and transformers are imported inside the functions only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from neuron_build.backends import AUTO, TEXTGEN_BACKENDS, find_backend
from neuron_build.compilers import graph_key, weights
from neuron_build.compilers.base import (
    CompileFailed,
    Compiler,
    CompilerBase,
    CompileRequest,
    CompileResult,
    enter_stage,
    load_class,
)
from neuron_build.loaders import AOTI_LOADER
from neuron_build.status import Status

#: The artifact file describing a text-generation graph.
INFO = "textgen.json"
#: The weights of an inductor text-generation graph (shared by every graph of the model and dtype).
WEIGHTS = "weights.safetensors"
#: Buffer name prefixes of the wrapper's static KV cache (the state, never weights).
STATE_PREFIXES = ("key_cache_", "value_cache_", "cumulative_length_")
EXPORT = "transformers.integrations.executorch.TorchExportableModuleWithStaticCache + torch.export(strict=True)"
#: ``inductor_configs`` of a graph whose weights are keyed by value (``weights = "inline"``): the weights
#: file beside the package, small 1-D and 0-d constants inlined into the kernels [measured: shared notes 3.4].
AOTI_CONFIG = {"aot_inductor.package_constants_in_so": False}
#: ... and of a graph keyed by its structure (``weights = "external"``): every constant outside.
AOTI_CONFIG_EXTERNAL = dict(weights.AOTI_EXTERNAL_CONFIG)
#: Fields of a transformers config that name where it came from, not what the graphs compute.
CONFIG_PROVENANCE = ("_name_or_path", "transformers_version", "_commit_hash", "dtype", "torch_dtype")


def causal_lm(model):
    """The transformers causal LM inside ``model`` (the module :func:`neuron_build.hf.build` wraps, or a
    factory's model), set up for a static cache: ``use_cache`` on in its config and its generation config,
    ``generation_config.cache_implementation = "static"`` (the wrapper asserts both [measured]). A checkpoint
    as published often has a ``generation_config.json`` naming only bos/eos (Llama-2's): transformers 5 then
    leaves ``generation_config.use_cache`` None, which the wrapper refuses, so it is set here.

    Raises:
        CompileFailed: ERROR when the module is not a transformers model with a generation config.
    """
    lm = getattr(model, "model", None) if type(model).__name__ == "HFOutput" else model
    if lm is None or getattr(lm, "generation_config", None) is None or not hasattr(lm, "config"):
        raise CompileFailed(Status.ERROR, f"a text-generation model must be a transformers causal LM (e.g. from "
                            f"AutoModelForCausalLM); got {type(model).__name__}")
    lm.config.use_cache = True
    lm.generation_config.use_cache = True
    lm.generation_config.cache_implementation = "static"
    return lm


def serving_facts(lm) -> dict[str, Any]:
    """What serving checks requests against, recorded in ``textgen.json``: ``vocab_size`` (rows of the input
    embedding: ids must be below it) and ``generation`` (``pad_token_id``, ``eos_token_id`` of the model's
    generation config, as transformers' ``generate`` pads finished rows)."""
    return {"vocab_size": int(lm.get_input_embeddings().num_embeddings), "generation": generation_settings(lm)}


def generation_settings(lm) -> dict[str, Any]:
    """What serving needs of a causal LM's ``generation_config``: ``pad_token_id`` and ``eos_token_id`` (int,
    list or None), as transformers' ``generate`` reads them."""
    gc = lm.generation_config
    return {"pad_token_id": gc.pad_token_id, "eos_token_id": gc.eos_token_id}


def static_wrapper(lm, batch: int, max_seq_len: int):
    """transformers' ``TorchExportableModuleWithStaticCache`` of ``lm`` for ``batch`` rows and a cache of
    ``max_seq_len`` positions (its KV buffers zeroed)."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    w = TorchExportableModuleWithStaticCache(lm, batch_size=batch, max_cache_len=max_seq_len)
    reset_state(w)
    return w.eval()


def reset_state(wrapper) -> None:
    """Zero the wrapper's KV cache buffers: the wrapper never clears K/V between sequences [measured]."""
    for name, buf in wrapper.named_buffers():
        if name.startswith(STATE_PREFIXES):
            buf.zero_()


def graph_inputs(graph: str, batch: int, seq: int) -> dict[str, Any]:
    """The example kwargs of a graph: prefill ``input_ids`` zeros ``[batch, seq]`` and ``cache_position``
    ``0..seq-1``; decode ``[batch, 1]`` and ``[seq]`` (any position: values do not change the graph)."""
    import torch

    if graph == "prefill":
        return {"input_ids": torch.zeros(batch, seq, dtype=torch.long), "cache_position": torch.arange(seq)}
    return {"input_ids": torch.zeros(batch, 1, dtype=torch.long), "cache_position": torch.tensor([seq])}


def state_spec(wrapper) -> list[dict[str, Any]]:
    """The KV state's tensors: ``[{"name", "shape", "dtype"}]`` (torch dtype names without ``torch.``)."""
    return [{"name": n, "shape": list(b.shape), "dtype": str(b.dtype).removeprefix("torch.")}
            for n, b in wrapper.named_buffers() if n.startswith(STATE_PREFIXES)]


def export_graph(wrapper, graph: str, batch: int, seq: int):
    """``torch.export.export(wrapper, (), kwargs, strict=True)`` of one graph (see :func:`graph_inputs`)."""
    import torch

    with torch.no_grad():
        return torch.export.export(wrapper, (), graph_inputs(graph, batch, seq), strict=True)


def weights_of(ep) -> dict[str, Any]:
    """The exported program's weights by FQN (parameters, persistent buffers and lifted constants, the KV
    state left out), each cloned and contiguous (tied weights become separate, identical tensors)."""
    out = {}
    for src in (ep.state_dict, ep.constants):
        for k, v in src.items():
            if not k.startswith(STATE_PREFIXES) and hasattr(v, "detach"):
                out[k] = v.detach().clone().contiguous()
    return dict(sorted(out.items()))


def export_or_no_key(wrapper, graph: str, batch: int, seq: int):
    """:func:`export_graph`, a failure of which means no graph key (the compile goes on and reports it).

    Raises:
        NoGraphKey: the graph does not export.
    """
    try:
        return export_graph(wrapper, graph, batch, seq)
    except Exception as e:
        raise graph_key.NoGraphKey(f"torch.export failed ({type(e).__name__})") from e


def graph_document(ep, wrapper, request: CompileRequest, lm=None, serving: bool = False) -> dict[str, Any]:
    """The graph key's document of a prefill or decode graph keyed with its weights by value: the exported
    program's canonical document (:func:`neuron_build.compilers.graph_key.export_document`: ops, weights by
    content, the KV state's buffers by value, the output spec) plus :func:`_section` (what ``textgen.json``
    records: graph kind, batch, seq, ``max_seq_len``, the state's names, shapes and dtypes, and with ``lm``
    its serving facts); with ``serving`` (compile-cache) also what the serving host rebuilds the model from
    (factory, kwargs, hf folder).

    Raises:
        NoGraphKey: anything the canonical form cannot read.
    """
    doc = {**graph_key.export_document(ep), "textgen": _section(wrapper, request, lm)}
    if serving:
        doc["serving"] = {"factory": request.factory, "kwargs": dict(request.kwargs), "hf": request.hf}
    return doc


def structure_document(ep, wrapper, request: CompileRequest, lm, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The structure part of a graph's key (``weights = "external"``): the canonical graph with every weight
    and KV tensor by name, dtype, shape and binding, never by value
    (:func:`neuron_build.compilers.weights.structure_document`), plus :func:`_section`, the model's config
    (:func:`model_config`) and the AOTInductor settings. New weight values keep it (a relink); a changed
    shape, dtype, config value, generation setting or graph changes it (a compile).

    Raises:
        NoGraphKey: anything the canonical form cannot read.
    """
    return {**weights.structure_document(ep, state), "textgen": _section(wrapper, request, lm),
            "config": model_config(lm), "aoti": dict(sorted(AOTI_CONFIG_EXTERNAL.items()))}


def model_config(lm) -> dict[str, Any]:
    """The causal LM's config as transformers serializes its non-default fields (``to_json_string(use_diff=
    True)``), without :data:`CONFIG_PROVENANCE`: a config value the graph holds only as a weight's value
    (``rope_theta``: ``inv_freq``) still changes the key (fail closed)."""
    raw = json.loads(lm.config.to_json_string(use_diff=True))
    return {k: v for k, v in sorted(raw.items()) if k not in CONFIG_PROVENANCE}


def _section(wrapper, request: CompileRequest, lm=None) -> dict[str, Any]:
    graph, batch, seq, max_seq_len = _options(request)
    out = {"graph": graph, "batch": batch, "seq": seq if graph == "prefill" else 1, "max_seq_len": max_seq_len,
           "state": state_spec(wrapper), "export": EXPORT}
    return out if lm is None else {**out, **serving_facts(lm)}


def _options(request: CompileRequest) -> tuple[str, int, int, int]:
    o = request.options
    return str(o["graph"]), int(o["batch"]), int(o["seq"]), int(o["max_seq_len"])


def _stage_weights(ep, out: Path) -> dict[str, Any] | None:
    """``weights = "external"``: every tensor the exported program binds (FQN -> tensor, the KV state
    included), its weights (the state left out) written to :data:`WEIGHTS` with their spec
    (:data:`~neuron_build.compilers.weights.SPEC_FILE`) in ``out`` before the key is asked for (a hit
    relinks them). None (a warning; the key then holds the weights by value) when they cannot be read or
    written: fail closed."""
    try:
        state = weights.exported_state(ep)
        weights.write(out, {k: v for k, v in state.items() if not k.startswith(STATE_PREFIXES)})
        return state
    except Exception as e:  # an unreadable state, a dtype safetensors cannot hold: keyed by value
        for name in (WEIGHTS, weights.SPEC_FILE):
            (out / name).unlink(missing_ok=True)
        print(f"warning: the weights cannot be kept apart ({type(e).__name__}: {str(e)[:200]}); "
              "keying the graph by its weights' values", flush=True)
        return None


def _aoti_compile(ep, package: Path, state: dict[str, Any] | None) -> str | None:
    """AOTInductor-compile ``ep`` to ``package``; with ``state`` (external weights) check that the package
    takes every weight and KV tensor as a constant from outside. Returns why it does not (a tensor inlined
    into its kernels: the package then serves only the values it was compiled with), or None."""
    import torch

    config = AOTI_CONFIG_EXTERNAL if state is not None else AOTI_CONFIG
    torch._inductor.aoti_compile_and_package(ep, package_path=str(package), inductor_configs=dict(config))
    if state is None:
        return None
    try:
        why = weights.uncovered(list(torch._inductor.aoti_load_package(str(package)).get_constant_fqns()), state)
    except Exception as e:  # a package that cannot list its constants cannot take them from outside
        why = f"the package cannot list its constants ({type(e).__name__})"
    if why is not None:
        print(f"warning: {why}: recorded with its weights inline (never relinked)", flush=True)
    return why


class TextGenInductorCompiler(CompilerBase):
    """Prefill or decode graph -> AOTInductor ``model.pt2`` (no weights inside) + ``weights.safetensors``
    (+ ``weights.json`` with ``weights = "external"``)."""

    name = "inductor"

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        from safetensors.torch import save_file

        from neuron_build.compilers.inductor import OP_COUNT_SOURCE, count_package_kernels

        if request.hardware_target != "cpu":
            raise CompileFailed(Status.ERROR, "text-generation graphs build for device = \"cpu\" only; set "
                                "device = \"cpu\" under [build]")
        graph, batch, seq, max_seq_len = _options(request)
        lm = causal_lm(model)
        wrapper = static_wrapper(lm, batch, max_seq_len)
        print(f"{graph} graph: batch {batch}, {'seq ' + str(seq) if graph == 'prefill' else 'one token'}, "
              f"KV cache {max_seq_len} positions; {EXPORT}", flush=True)
        enter_stage("export")
        ep = export_graph(wrapper, graph, batch, seq)
        print(f"exported graph: {len(ep.graph.nodes)} nodes; AOTInductor compile for cpu (weights outside)",
              flush=True)
        out = Path(request.out_dir)
        state = None if request.inline_weights_to_neff else _stage_weights(ep, out)
        if state is not None:  # keyed by structure: a hit relinks the weights just staged
            graph_key.checkpoint(request, lambda: structure_document(ep, wrapper, request, lm, state))
        else:
            graph_key.checkpoint(request, lambda: graph_document(ep, wrapper, request, lm))  # a hit stops here
        enter_stage("compile")
        why = _aoti_compile(ep, out / "model.pt2", state)
        enter_stage("save")
        if state is None:
            tensors = weights_of(ep)
            save_file(tensors, str(out / WEIGHTS))
        else:
            tensors = {k: v for k, v in state.items() if not k.startswith(STATE_PREFIXES)}
        info = {"graph": graph, "batch": batch, "seq": seq if graph == "prefill" else 1,
                "max_seq_len": max_seq_len, "state": state_spec(wrapper), "weights": WEIGHTS,
                "artifact": "model.pt2", "export": EXPORT, **serving_facts(lm)}
        (out / INFO).write_text(json.dumps(info, indent=2) + "\n")
        enter_stage("count")
        ops, breakdown = count_package_kernels(out / "model.pt2")
        print(f"op count {ops}; weights {len(tensors)} tensors", flush=True)
        details = {"artifact": "model.pt2", "loader": AOTI_LOADER, "textgen": info,
                   "exported_nodes": len(ep.graph.nodes), "op_breakdown": breakdown,
                   "weights": "external" if state is not None and why is None else "inline"}  # (relink: external)
        if why is not None or (state is None and not request.inline_weights_to_neff):
            details["weights_inline_why"] = why or "the weights could not be kept apart"
        return CompileResult(op_count=ops, op_count_source=OP_COUNT_SOURCE, details=details)


class TextGenCompileCacheCompiler(CompilerBase):
    """Prefill or decode graph -> ``torch.compile`` caches of the static-cache wrapper
    (:class:`neuron_build.compilers.compile_cache.CompileCacheCompiler`'s files)."""

    name = "compile-cache"

    def preflight(self, request: CompileRequest) -> None:
        from neuron_build.compilers.compile_cache import CompileCacheCompiler

        CompileCacheCompiler().preflight(request)

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        import torch

        from neuron_build.compilers import compile_cache as cc

        if request.hardware_target != "cpu":
            raise CompileFailed(Status.ERROR, "text-generation graphs build for device = \"cpu\" only; set "
                                "device = \"cpu\" under [build]")
        graph, batch, seq, max_seq_len = _options(request)
        wrapper = static_wrapper(causal_lm(model), batch, max_seq_len)
        graph_key.checkpoint(request, lambda: graph_document(export_or_no_key(wrapper, graph, batch, seq), wrapper,
                                                             request, serving=True))
        reset_state(wrapper)  # (the export ran the wrapper's code: the warm-up starts from an empty cache)
        kwargs = cc.torch_compile_kwargs("compile-cache")
        torch._dynamo.reset()
        before, n0 = cc.compile_counters(), cc.n_graph_rows()
        print(f"{graph} graph: torch.compile({kwargs}) of the static-cache wrapper, batch {batch}, KV cache "
              f"{max_seq_len}", flush=True)
        enter_stage("compile")
        compiled = torch.compile(wrapper, **kwargs)
        inputs = graph_inputs(graph, batch, seq)
        try:
            with torch.no_grad():
                compiled(**inputs)
        except Exception as e:
            brk = cc.graph_break(e)
            if brk:
                raise CompileFailed(Status.ERROR, f"graph break: {brk}", 1, {"graph_break": brk}) from e
            raise
        counts = cc.counter_delta(before, cc.compile_counters())
        rows = cc.graph_rows(n0)
        enter_stage("save")
        out = Path(request.out_dir)
        blob = cc.capture(out)
        cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        kernels = []
        for src in cc.kernel_files(cache_dir):
            rel = f"{cc.KERNEL_DIR}/{src.relative_to(cache_dir).as_posix()}"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / rel)
            kernels.append(rel)
        info = {"graph": graph, "batch": batch, "seq": seq if graph == "prefill" else 1,
                "max_seq_len": max_seq_len, "state": state_spec(wrapper), "artifact": cc.BLOB}
        (out / INFO).write_text(json.dumps(info, indent=2) + "\n")
        ops = sum(int(r["op_count"] or 0) for r in rows) if rows else None
        serving = cc.serving_settings("compile-cache", request, env=cc.inductor_env(os.environ))
        serving["textgen"] = {"max_seq_len": max_seq_len}
        return CompileResult(op_count=ops, op_count_source=cc.OP_COUNT_SOURCE if rows else None, details={
            "artifact": cc.BLOB, "loader": cc.LOADER, "artifact_kind": "compile-cache", "textgen": info,
            "serving": serving, "graphs": rows, "cache": blob, "counters": counts, "kernels": kernels})


def textgen_compiler(backend: str) -> Compiler:
    """The compiler of a text-generation graph for ``backend``: its record's ``textgen_compiler``
    (:mod:`neuron_build.backends`).

    Raises:
        CompileFailed: ERROR for a backend that does not build text-generation graphs (the record's reason).
    """
    spec = find_backend(backend)
    if spec is None or spec.textgen_compiler is None:
        why = spec.textgen_reason if spec is not None else "no such backend"
        raise CompileFailed(Status.ERROR, f"text-generation models build with backend "
                            f"{' or '.join(b for b in TEXTGEN_BACKENDS if b != AUTO)}, not {backend} ({why}); set "
                            f"backend = \"inductor\" under [build]")
    return load_class(spec.textgen_compiler)()


__all__ = ["AOTI_CONFIG", "AOTI_CONFIG_EXTERNAL", "CONFIG_PROVENANCE", "INFO", "STATE_PREFIXES", "WEIGHTS",
           "TextGenCompileCacheCompiler", "TextGenInductorCompiler", "causal_lm", "export_graph", "export_or_no_key",
           "graph_document", "graph_inputs", "model_config", "reset_state", "state_spec", "static_wrapper",
           "structure_document", "textgen_compiler", "weights_of"]
