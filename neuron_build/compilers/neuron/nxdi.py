"""NxDI (NeuronX Distributed Inference) for text-generation models on ``backend = "neuron"``.

The call sequence [code: NxDI examples/generation_demo.py; shared notes 1.1]::

    neuron_config = NeuronConfig(**kwargs, on_device_sampling_config=OnDeviceSamplingConfig(top_k=1))
    config = LlamaInferenceConfig(neuron_config, load_config=load_pretrained_config(model_path))
    NeuronLlamaForCausalLM(model_path, config).compile(artifact_dir)      # build
    NeuronLlamaForCausalLM(artifact_dir).load(artifact_dir)                # serve

``kwargs`` are the target's key details (:func:`neuron_build.project.textgen.neuron_config`). The compiled
folder is the artifact: ``neuron_config.json`` and ``model.pt`` (every NEFF of every bucket) [code:
application_base.py]. NxD traces in ``BASE_COMPILE_WORK_DIR``, which it removes first [code: NxD
model_builder.py]: it is set to ``<work dir>/nxd_model`` so that nothing outside the compile's workdir is
touched, and each bucket's ``log-neuron-cc.txt`` there is kept with a failure. The compiler args NxDI
passed per submodel and bucket are read back from those logs (the ``Invoked as:`` line the compiler
writes) into the manifest's ``compiler.nxdi.compiler_args``. A failure is classified like any neuronx-cc
failure (:func:`neuron_build.compilers.neuron.classify_failure`: status, diagnostic code, transient exit 70).
Imported lazily: nothing here runs without ``neuronx_distributed_inference``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import CompileFailed, CompileRequest, CompileResult, enter_stage
from neuron_build.status import Status

#: HF ``model_type`` -> (NxDI module, InferenceConfig class, application class) [code: NxDI models/].
MODEL_CLASSES = {
    "llama": ("neuronx_distributed_inference.models.llama.modeling_llama", "LlamaInferenceConfig",
              "NeuronLlamaForCausalLM"),
}
LOADER = "neuronx_distributed_inference:load"
_INVOKED = re.compile(r"Invoked as: (.*)$", re.M)


def model_classes(model_type: str):
    """(InferenceConfig class, application class) of an HF ``model_type``.

    Raises:
        CompileFailed: ERROR naming the model types this build knows.
    """
    if model_type not in MODEL_CLASSES:
        raise CompileFailed(Status.ERROR, f"NxDI: no model class for model_type {model_type!r} here; known: "
                            f"{', '.join(MODEL_CLASSES)}")
    mod, cfg, app = MODEL_CLASSES[model_type]
    m = importlib.import_module(mod)
    return getattr(m, cfg), getattr(m, app)


def bucket_compiler_args(work: Path) -> dict[str, list[str]]:
    """``<tag>/_tp0_bk<i>`` -> the neuronx-cc arguments read from its ``log-neuron-cc.txt`` (the flags
    after ``compile <input>``, without ``--output``/``--logfile`` and their absolute paths)."""
    out = {}
    for log in sorted(work.rglob("log-neuron-cc.txt")):
        m = _INVOKED.search(log.read_text(errors="replace"))
        if not m:
            continue
        argv = shlex.split(m.group(1))[3:]
        keep, skip = [], False
        for a in argv:
            if skip:
                skip = False
                continue
            if a in ("--output", "--logfile"):
                skip = True
                continue
            if a.startswith(("--output=", "--logfile=")):
                continue
            keep.append(a)
        out[log.parent.relative_to(work).as_posix()] = keep
    return out


class NxDICompiler:
    """One NxDI compile of a text-generation model at one batch size: every prefill (context-encoding) and
    decode (token-generation) bucket, into the artifact folder."""

    name = "neuron"
    needs_module = False  # NxDI reads the checkpoint folder itself

    def preflight(self, request: CompileRequest) -> None:
        try:
            importlib.import_module("neuronx_distributed_inference")
        except ImportError as e:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, f"neuronx-distributed-inference is not installed ({e}); "
                                "install it from the Neuron package index (see \"On a Neuron host\" in README.md)",
                                exit_code=3) from None

    def model_path(self, request: CompileRequest) -> Path:
        """The HF checkpoint folder NxDI loads: the ``hf`` folder, or a factory's model saved with
        ``save_pretrained`` into the workdir."""
        if request.hf is not None:
            from neuron_build import hf
            return hf.resolve(request.hf["source"], Path(request.root))
        from neuron_build.examples import build_model

        folder = Path(request.work_dir) / "checkpoint"
        lm = build_model(request.root, request.factory, request.kwargs, "fp32")
        lm = getattr(lm, "model", lm)
        lm.save_pretrained(folder)
        return folder

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        from neuronx_distributed_inference.models.config import NeuronConfig, OnDeviceSamplingConfig
        from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

        from neuron_build.compilers.neuron import classify_failure
        from neuron_build.compilers.neuron.neuronx_log import parse_log

        kwargs = dict(request.options["neuron_config"])
        work = Path(request.work_dir).resolve() / "nxd_model"
        os.environ["BASE_COMPILE_WORK_DIR"] = str(work) + "/"
        os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", request.hardware_target)
        path = self.model_path(request)
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
        cfg_cls, app_cls = model_classes(model_type)
        sampling = OnDeviceSamplingConfig(**kwargs.pop("on_device_sampling_config"))
        print(f"NxDI: NeuronConfig({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}, "
              f"on_device_sampling_config=OnDeviceSamplingConfig(top_k=1)); {app_cls.__name__}", flush=True)
        nc = NeuronConfig(**kwargs, on_device_sampling_config=sampling)
        config = cfg_cls(nc, load_config=load_pretrained_config(str(path)))
        out = Path(request.out_dir)
        enter_stage("compile")
        try:
            app_cls(str(path), config).compile(str(out))
        except Exception as e:
            logs = sorted(work.rglob("log-neuron-cc.txt"), key=lambda p: p.stat().st_mtime)
            raise classify_failure(e, logs, Path(request.work_dir), has_neuron_device=False,
                                   tp_degree=int(kwargs["tp_degree"])) from e
        enter_stage("count")
        if not (out / "model.pt").is_file():
            raise CompileFailed(Status.ERROR, f"NxDI compile() wrote no model.pt into {out.name}")
        args = bucket_compiler_args(work)
        ops = 0
        for log in work.rglob("log-neuron-cc.txt"):
            n = parse_log(log.read_bytes()).op_count
            ops += n or 0
        details: dict[str, Any] = {
            "artifact": "model.pt", "loader": LOADER, "artifact_kind": "nxdi",
            "nxdi": {"application": f"{app_cls.__module__}.{app_cls.__name__}", "neuron_config": request.options["neuron_config"],
                     "compiler_args": args, "files": sorted(p.name for p in out.iterdir())}}
        print(f"NxDI compiled {len(args)} bucket(s): {', '.join(args)}", flush=True)
        return CompileResult(op_count=ops or None, op_count_source="neuronx-cc logs, summed over buckets" if ops else None,
                             details=details)


# -- serving a pulled NxDI release ----------------------------------------------------------------------
def is_nxdi_release(release: dict[str, Any]) -> bool:
    """Whether a pulled ``release.json`` holds NxDI artifacts (their recorded loader is :data:`LOADER`)."""
    return any(isinstance(b, dict) and b.get("loader") == LOADER for b in release.get("buckets") or [])


def host_problem(release: dict[str, Any], where: str, tp_degree: int | None = None,
                 cores: list[str] | None = None) -> str | None:
    """One line saying that this host cannot run an NxDI release (no NeuronCore: no ``/dev/neuron<N>``,
    :func:`neuron_build.project.toolchain.neuron_devices`) and what host it needs, or None.

    Args:
        release: the pulled ``release.json`` content (or a dict with ``model``, ``backend``,
            ``hardware_target``).
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
    hw = release.get("hardware_target")
    return (f"{where}: an NxDI release of {release.get('model')} (backend {release.get('backend')}, {hw}) runs "
            f"only on a Neuron host and this host has no NeuronCore (no /dev/neuron*); serve, validate and "
            f"bench it on a {hw} instance{need}")


def pulled_tp_degree(release: dict[str, Any], root: Path) -> int | None:
    """The largest ``tp_degree`` the bucket folders' ``neuron_config.json`` name (None: none readable)."""
    tps = []
    for b in release.get("buckets") or []:
        try:
            tps.append(int(json.loads((root / b["id"] / "neuron_config.json").read_text())["neuron_config"]["tp_degree"]))
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


def nxdi_engine(release: dict[str, Any], root: Path, folders: list[Path] | None = None,
                where: str | None = None) -> NxDIEngine:
    """Load a pulled NxDI release: per bucket folder, NxDI's application class of the compiled model's
    ``model_type`` (:data:`MODEL_CLASSES`) as NxDI serves a compiled folder: ``Cls(path)`` (which reads
    ``neuron_config.json``), ``.load(path)`` (``model.pt`` onto the NeuronCores), then
    ``HuggingFaceGenerationAdapter(app)`` [code: NxDI examples/generation_demo.py; hlo-before-neff notes 4].

    Args:
        release: the pulled ``release.json`` content (``model``, ``backend``, ``hardware_target``, ``buckets``).
        root: the pulled folder (the bucket folders are ``root / <bucket id>``).
        folders: the compiled folders instead (validation and bench load artifacts from the store).
        where: names what is loaded in messages (default: ``root/release.json``).

    Raises:
        UserError: this host has no NeuronCore (one line: what host the release needs, :func:`host_problem`);
            NxDI is not installed; a folder's ``neuron_config.json`` is unreadable or names an unknown model
            type.
    """
    from neuron_build.errors import UserError

    where = where or str(root / "release.json")
    if folders is None:
        folders = [root / b["id"] for b in release["buckets"]]
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
    problem = host_problem(release, where, max(c[5] for c in configs))
    if problem:
        raise UserError(problem)
    try:
        from neuronx_distributed_inference.utils.hf_adapter import HuggingFaceGenerationAdapter
    except ImportError as e:
        raise UserError(f"{where}: an NxDI release needs neuronx-distributed-inference on the serving host "
                        f"({e}); install it from the Neuron package index") from None
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
    return NxDIEngine(apps, str(release.get("model", "model")), min(c[3] for c in configs),
                      min(c[4] for c in configs), pad if isinstance(pad, int) else None)


__all__ = ["LOADER", "MODEL_CLASSES", "NxDICompiler", "NxDIEngine", "bucket_compiler_args", "host_problem",
           "is_nxdi_release", "model_classes", "nxdi_engine", "pulled_tp_degree"]
