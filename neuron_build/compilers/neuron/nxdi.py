"""NxDI (NeuronX Distributed Inference) for text-generation models on ``backend = "neuron"``.

The call sequence [code: NxDI examples/generation_demo.py; shared notes 1.1]::

    neuron_config = NeuronConfig(**kwargs, on_device_sampling_config=OnDeviceSamplingConfig(top_k=1))
    config = LlamaInferenceConfig(neuron_config, load_config=load_pretrained_config(model_path))
    NeuronLlamaForCausalLM(model_path, config).compile(artifact_dir)      # build
    NeuronLlamaForCausalLM(artifact_dir).load(artifact_dir)                # serve

``kwargs`` are the target's key details (:func:`neuron_build.project.textgen.neuron_config`). The compiled
folder is the artifact: ``neuron_config.json``, ``model.pt`` (every NEFF of every bucket) [code:
application_base.py] and the checkpoint sharded per rank into ``weights/`` (``save_sharded_checkpoint``) with
its spec ``weights.json``: a release needs no checkpoint folder, and a fine-tune (same config, same tensor
names, dtypes and shapes) is sharded and relinked with the stored NEFFs instead of traced and compiled
(:mod:`neuron_build.compilers.neuron.nxdi_weights`). NxD traces in ``BASE_COMPILE_WORK_DIR``, which it removes first [code: NxD
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
import shutil
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import (
    EXIT_TOOLCHAIN_MISSING,
    CompileFailed,
    CompilerBase,
    CompileRequest,
    CompileResult,
    enter_stage,
)
from neuron_build.loaders import NXDI_LOADER
from neuron_build.status import Status

#: HF ``model_type`` -> (NxDI module, InferenceConfig class, application class) [code: NxDI models/].
MODEL_CLASSES = {
    "llama": ("neuronx_distributed_inference.models.llama.modeling_llama", "LlamaInferenceConfig",
              "NeuronLlamaForCausalLM"),
}
LOADER = NXDI_LOADER
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


class NxDICompiler(CompilerBase):
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
                                exit_code=EXIT_TOOLCHAIN_MISSING) from None

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
        """Run NxDI's compile with the stable work directory and the store-owned persistent cache
        (:mod:`neuron_build.compilers.neuron.nxdi_cache`), under a file lock on the work directory."""
        from filelock import FileLock

        from neuron_build.compilers.neuron import nxdi_cache

        kwargs = dict(request.options["neuron_config"])
        work = nxdi_cache.stable_workdir(request.target)  # the flags, and so the cache keys, hold this path
        work.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(work) + ".lock")
        cache = Path(request.options.get(nxdi_cache.OPTION) or Path(request.work_dir).resolve() / nxdi_cache.CACHE_FILES)
        cache.mkdir(parents=True, exist_ok=True)
        os.environ["BASE_COMPILE_WORK_DIR"] = str(work) + "/"
        os.environ.update(nxdi_cache.environ_for(cache))
        os.environ.setdefault("NEURON_PLATFORM_TARGET_OVERRIDE", request.hardware_target)
        with lock:
            return self._compile(request, kwargs, work, cache)

    def _compile(self, request: CompileRequest, kwargs: dict[str, Any], work: Path, cache: Path) -> CompileResult:
        from neuronx_distributed_inference.models.config import NeuronConfig, OnDeviceSamplingConfig
        from neuronx_distributed_inference.utils.hf_adapter import load_pretrained_config

        from neuron_build.compilers.neuron import classify_failure, nxdi_cache, nxdi_weights
        from neuron_build.compilers.neuron.neuronx_log import parse_log

        before = nxdi_cache.entries(cache)
        path = self.model_path(request)
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
        cfg_cls, app_cls = model_classes(model_type)
        sampling = OnDeviceSamplingConfig(**kwargs.pop("on_device_sampling_config"))
        print(f"NxDI: NeuronConfig({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}, "
              f"on_device_sampling_config=OnDeviceSamplingConfig(top_k=1)); {app_cls.__name__}", flush=True)
        nc = NeuronConfig(**kwargs, on_device_sampling_config=sampling)
        config = cfg_cls(nc, load_config=load_pretrained_config(str(path)))
        out = Path(request.out_dir)
        app = app_cls(str(path), config)
        application = f"{app_cls.__module__}.{app_cls.__name__}"
        structure = Path(request.work_dir) / "nxdi-structure"  # the weights apart: a hit shards, no trace
        nxdi_weights.checkpoint(request, lambda: nxdi_weights.structure_document(
            nxdi_weights.saved_config(config, structure), application, path), app, out)
        enter_stage("compile")
        try:
            app.compile(str(out))
        except Exception as e:
            kept = Path(request.work_dir) / "nxd_model"  # kept with the failure (the stable folder is reused)
            shutil.copytree(work, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.neff", "weights"))
            logs = sorted(kept.rglob("log-neuron-cc.txt"), key=lambda p: p.stat().st_mtime)
            raise classify_failure(e, logs, Path(request.work_dir), has_neuron_device=False,
                                   tp_degree=int(kwargs["tp_degree"])) from e
        enter_stage("count")
        if not (out / "model.pt").is_file():
            raise CompileFailed(Status.ERROR, f"NxDI compile() wrote no model.pt into {out.name}")
        try:
            shards = nxdi_weights.write_spec(out)  # compile() sharded them (save_sharded_checkpoint)
        except (OSError, ValueError) as e:
            raise CompileFailed(Status.ERROR, f"NxDI compile() left no readable sharded weights ({e}); the "
                                "release would need the build host's checkpoint folder") from None
        buckets = nxdi_cache.collect(cache, before, work, out)
        args = bucket_compiler_args(work)
        ops = 0
        for log in work.rglob("log-neuron-cc.txt"):
            n = parse_log(log.read_bytes()).op_count
            ops += n or 0
        details: dict[str, Any] = {
            "artifact": "model.pt", "loader": LOADER, "artifact_kind": "nxdi", "weights": "external",
            "nxdi": {"application": application, "neuron_config": request.options["neuron_config"], "weights": shards,
                     "compiler_args": args, "files": sorted(p.name for p in out.iterdir() if p.name != nxdi_cache.CACHE_FILES),
                     "buckets": buckets}}
        hits = sorted(b for b, v in buckets.items() if v["source"] == "cache")
        print(f"NxDI compiled {len(args)} bucket(s): {', '.join(args)}; from the persistent cache: "
              f"{', '.join(hits) or 'none'}", flush=True)
        return CompileResult(op_count=ops or None, op_count_source="neuronx-cc logs, summed over buckets" if ops else None,
                             details=details)


__all__ = ["LOADER", "MODEL_CLASSES", "NxDICompiler", "bucket_compiler_args", "model_classes"]
