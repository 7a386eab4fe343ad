"""LlamaInferenceConfig and NeuronLlamaForCausalLM: compile(dir) and load(dir) as NxDI's application base
does them (shared notes 1.4, NxDI models/application_base.py, NxD trace/model_builder.py), with the
neuronx-cc double on PATH compiling each submodel's buckets. Files compile() writes:

    <compiled dir>/neuron_config.json        the full InferenceConfig (json, indent 2, sorted keys)
    <compiled dir>/model.pt                  one archive holding every NEFF (here: a JSON index + the NEFFs)
    <compiled dir>/weights/tp{rank}_sharded_checkpoint.safetensors   with save_sharded_checkpoint (shard_weights)

load(dir) needs a NeuronCore (FAKE_NEURON_HAS_DEVICE set and not 0), else raises the runtime's RuntimeError;
then, as NxDI's load_weights [code: application_base.py:375-420], it reads weights/ when the saved config has
save_sharded_checkpoint, else shards the HF checkpoint at ``_name_or_path`` (else ``model_path``) on load.
generation goes through utils.hf_adapter.HuggingFaceGenerationAdapter with next_token() as the model.

Sharding (shard_weights / on load; NxD ModelBuilder.shard_checkpoint on CPU): the checkpoint NxDI's
load_state_dict reads (model.safetensors, else model.safetensors.index.json's files, else FileNotFoundError),
"model." prefixes dropped, floating tensors cast to torch_dtype, a 2-D tensor whose first dim divides by
tp_degree split along it (else replicated), plus ``rank_util.rank`` (int32 [tp_degree]) [guess: NxD's
real partitioning is per layer type].
    $BASE_COMPILE_WORK_DIR (default /tmp/nxd_model/), removed first:
        neuron_config.json
        <tag>/_tp0_bk<i>/model/graph.hlo, graph.neff, log-neuron-cc.txt, neuron_config.json

Log lines (stdout): ``Generating HLOs for the following models: ['context_encoding_model',
'token_generation_model']``, ``Started compilation for all HLOs``, ``Finished Compilation for all HLOs in
<s> seconds``, ``Finished building model in <s> seconds``. A compile failure raises
``RuntimeError("neuronx-cc failed with <status>")`` as NxD's compile helper does [guess on the wording].
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time

from neuronx_distributed_inference.models.config import InferenceConfig, record

CTE, TKG = "context_encoding_model", "token_generation_model"


class LlamaInferenceConfig(InferenceConfig):
    def get_required_attributes(self):
        return ["hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps", "hidden_act"]


def _compiler_args(nc, tag: str) -> str:
    """NxDI ModelWrapper's default compiler args (shared notes 1.6), then NxD's --verbose=35."""
    tiling = 1 if tag == TKG else nc.cc_pipeline_tiling_factor
    args = (f"--auto-cast=none --model-type=transformer --tensorizer-options='--enable-ccop-compute-overlap "
            f"--cc-pipeline-tiling-factor={tiling} --vectorize-strided-dma ' --lnc={nc.logical_nc_config}")
    if tag == CTE:
        args += " -O1 --internal-hlo2tensorizer-options='--modular-flow-mac-threshold=10 --verify-hlo=true'"
    else:
        args += " -O2 --internal-hlo2tensorizer-options='--verify-hlo=true'"
    return args + " --verbose=35"


class NeuronLlamaForCausalLM:
    _config_cls = LlamaInferenceConfig

    def __init__(self, model_path, config=None):
        self.model_path = model_path
        self.config = config if config is not None else self._config_cls.load(model_path)
        self.neuron_config = self.config.neuron_config
        self.is_loaded_to_neuron = False

    def buckets(self):
        nc = self.neuron_config
        if not nc.enable_bucketing:
            return {CTE: [nc.max_context_length], TKG: [nc.max_length]}
        return {CTE: nc.context_encoding_buckets or [nc.max_context_length],
                TKG: nc.token_generation_buckets or [nc.max_length]}

    def compile(self, compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False):
        record("compile", app=type(self).__name__, model_path=self.model_path, compiled_model_path=compiled_model_path,
               debug=debug, dry_run=dry_run)
        t0 = time.monotonic()
        self.config.save(compiled_model_path)
        work = os.environ.get("BASE_COMPILE_WORK_DIR", "/tmp/nxd_model/")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        self.config.save(work)
        nc = self.neuron_config
        target = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
        print(f"Generating HLOs for the following models: {[CTE, TKG]}", flush=True)
        neffs = {}
        plan = []
        for tag, buckets in self.buckets().items():
            for i, n in enumerate(buckets):
                d = os.path.join(work, tag, f"_tp0_bk{i}")
                os.makedirs(os.path.join(d, "model"))
                rows = nc.batch_size
                cols = n if tag == CTE else 1
                with open(os.path.join(d, "model", "graph.hlo"), "w") as f:
                    f.write(f"HloModule {tag}_bk{i}\n" + "".join(
                        f"op {k} dot [{rows},{cols},{self.config.hidden_size}]\n" for k in range(2 * self.config.num_hidden_layers)))
                self.config.save(d)
                plan.append((tag, i, n, d))
        if dry_run:
            return
        print("Started compilation for all HLOs", flush=True)
        cache = PersistentCache()
        for tag, i, n, d in plan:
            # NxD appends --logfile=<absolute bucket workdir> before it hashes the flags [code: shared notes 1.2]
            flags = (f"--target={target} {_compiler_args(nc, tag)} "
                     f"--logfile={os.path.join(d, 'log-neuron-cc.txt')}")
            with open(os.path.join(d, "model", "graph.hlo")) as f:
                hlo = f.read()
            entry = cache.entry(get_hash_module(hlo, flags), _split(flags))
            if entry.exists():
                print(f"Using a cached neff at {entry.path} for {tag}/_tp0_bk{i}", flush=True)
                shutil.copyfile(entry.neff, os.path.join(d, "graph.neff"))
                record_cache(bucket=f"{tag}/_tp0_bk{i}", hit=True, entry=os.path.basename(entry.path))
            else:
                cmd = ["neuronx-cc", "compile", os.path.join(d, "model", "graph.hlo"), "--framework", "XLA",
                       "--target", target, *_split(_compiler_args(nc, tag)), "--output", os.path.join(d, "graph.neff"),
                       f"--logfile={os.path.join(d, 'log-neuron-cc.txt')}"]
                status = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
                if status != 0:
                    raise RuntimeError(f"neuronx-cc failed with {status}")
                entry.store(hlo, os.path.join(d, "graph.neff"))
                record_cache(bucket=f"{tag}/_tp0_bk{i}", hit=False, entry=os.path.basename(entry.path))
            with open(os.path.join(d, "graph.neff"), "rb") as f:
                neffs[f"{tag}/_tp0_bk{i}"] = {"bucket": n, "neff": base64.b64encode(f.read()).decode()}
        print(f"Finished Compilation for all HLOs in {time.monotonic() - t0:.1f} seconds", flush=True)
        with open(os.path.join(compiled_model_path, "model.pt"), "w") as f:
            json.dump({"format": "fake-nxd-model", "tp_degree": nc.tp_degree, "neffs": neffs}, f)
        self.shard_weights(compiled_model_path, debug)
        print(f"Finished building model in {time.monotonic() - t0:.1f} seconds", flush=True)

    def shard_weights(self, compiled_model_path, debug=False, pre_shard_weights_hook=None):
        """NxDI's shard_weights: with save_sharded_checkpoint (and not skip_sharding), the checkpoint sharded
        into ``<compiled_model_path>/weights/`` [code: application_base.py:240-265]."""
        sharded_dir = os.path.join(compiled_model_path, "weights/")
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        nc = self.neuron_config
        if getattr(nc, "skip_sharding", False) or not nc.save_sharded_checkpoint:
            return
        record("shard_weights", compiled_model_path=compiled_model_path, checkpoint=self._checkpoint_path())
        self.shard_checkpoint(serialize_path=sharded_dir)

    def _checkpoint_path(self):
        path = getattr(self.config, "_name_or_path", None)
        return path if path is not None and os.path.exists(path) else self.model_path

    def shard_checkpoint(self, serialize_path=None):
        """The builder's shard_checkpoint: one state dict per rank, each saved when ``serialize_path``."""
        import torch
        from safetensors.torch import save_file

        sd = _load_state_dict(self._checkpoint_path())
        nc = self.neuron_config
        dtype = getattr(torch, nc.torch_dtype)
        tp = int(nc.tp_degree)
        if serialize_path is not None:
            os.makedirs(serialize_path, exist_ok=True)
        out = []
        for rank in range(tp):
            shard = {}
            for name, t in sd.items():
                t = t.to(dtype) if t.is_floating_point() else t
                if t.dim() == 2 and t.shape[0] % tp == 0:
                    t = t.chunk(tp, dim=0)[rank]
                shard[name.removeprefix("model.")] = t.contiguous().clone()
            shard["rank_util.rank"] = torch.arange(tp, dtype=torch.int32)
            if serialize_path is not None:
                save_file(shard, os.path.join(serialize_path, f"tp{rank}_sharded_checkpoint.safetensors"))
            out.append(shard)
        return out

    def is_compiled(self, compiled_model_path):
        return os.path.exists(os.path.join(compiled_model_path, "model.pt"))

    def load(self, compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False):
        record("load", compiled_model_path=compiled_model_path)
        if not self.is_compiled(compiled_model_path):
            raise FileNotFoundError(f"{compiled_model_path}/model.pt not found; compile the model first")
        if os.environ.get("FAKE_NEURON_HAS_DEVICE", "0") in ("", "0"):
            # the Neuron runtime finds no device [guess on the wording: nrt_init's failure as torch-neuronx raises it]
            raise RuntimeError("nrt_init failed: no Neuron device found (NRT_RESOURCE)")
        with open(os.path.join(compiled_model_path, "model.pt")) as f:
            self.traced_model = json.load(f)
        self.load_weights(compiled_model_path)
        self.is_loaded_to_neuron = True

    def load_weights(self, compiled_model_path, start_rank_id=None, local_ranks_size=None):
        """weights/tp{rank}_sharded_checkpoint.safetensors when pre-sharded, else shard on load; recorded as
        ``{"call": "load_weights", "source", "digest"}`` (digest: sha256 of every tensor's bytes, rank order)."""
        import hashlib

        import torch
        from safetensors.torch import load_file

        if self.neuron_config.save_sharded_checkpoint:
            source = "weights/"
            weights = [load_file(os.path.join(compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors"))
                       for rank in range(int(self.neuron_config.tp_degree))]
        else:
            source = self._checkpoint_path()
            weights = self.shard_checkpoint()
        h = hashlib.sha256()
        for shard in weights:
            for name in sorted(shard):
                h.update(name.encode() + shard[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        self.weights = weights
        record("load_weights", source=source, digest=h.hexdigest())

    def reset(self):
        """Reset the KV cache between generate() calls (the adapter calls it first)."""
        record("reset")

    def next_token(self, last: int, step: int) -> int:
        """The double's "compiled model": a deterministic next token from the last one and the step (the
        real model's logits are out of reach without a NeuronCore)."""
        return (last * 7 + step + 3) % int(self.config.vocab_size)


def _load_state_dict(folder):
    """NxDI's load_state_dict for the two safetensors forms [code: modules/checkpoint.py]."""
    import json as _json

    from safetensors.torch import load_file

    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(single):
        return load_file(single)
    if os.path.isfile(index):
        with open(index) as f:
            files = set(_json.load(f)["weight_map"].values())
        sd = {}
        for name in sorted(files):
            sd.update(load_file(os.path.join(folder, name)))
        return sd
    raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {folder}")


def get_hash_module(hlo_module, flags: str) -> str:
    """NxD's cache key: sha256 of the HLO's text plus the flag string without spaces, 20 hex digits [code:
    NxD model_builder.py]. No toolchain version: the cache folder's neuronxcc-<version> level separates those."""
    import hashlib
    return hashlib.sha256((str(hlo_module) + flags.replace(" ", "")).encode()).hexdigest()[:20]


class CacheEntry:
    """``<root>/neuronxcc-<version>/MODULE_<key>+<flags hash>/``: model.hlo_module.pb, compile_flags.json,
    model.neff, and model.done written last (the entry exists only with it) [doc: neuron-caching.rst]."""

    def __init__(self, path: str):
        self.path = path
        self.neff = os.path.join(path, "model.neff")

    def exists(self) -> bool:
        return os.path.isfile(os.path.join(self.path, "model.done")) and os.path.isfile(self.neff)

    def store(self, hlo: str, neff: str) -> None:
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "model.hlo_module.pb"), "w") as f:
            f.write(hlo)
        tmp = self.neff + ".tmp"
        shutil.copyfile(neff, tmp)
        os.replace(tmp, self.neff)
        open(os.path.join(self.path, "model.done"), "w").close()


class PersistentCache:
    """libneuronxla's persistent compile cache, the folder kind: the root is NEURON_COMPILE_CACHE_URL, else
    ``--cache_dir=`` in NEURON_CC_FLAGS, else /var/tmp/neuron-compile-cache [doc: neuron-caching.rst]."""

    def __init__(self):
        root = os.environ.get("NEURON_COMPILE_CACHE_URL", "").strip()
        for flag in _split(os.environ.get("NEURON_CC_FLAGS", "")):
            if flag.startswith("--cache_dir="):
                root = root or flag.split("=", 1)[1]
        self.root = root or "/var/tmp/neuron-compile-cache"
        import neuronxcc
        self.version_dir = os.path.join(self.root, f"neuronxcc-{neuronxcc.__version__}")

    def entry(self, key: str, flags: list) -> CacheEntry:
        import hashlib
        fh = hashlib.md5(json.dumps(flags).encode()).hexdigest()[:8]
        e = CacheEntry(os.path.join(self.version_dir, f"MODULE_{key}+{fh}"))
        if not e.exists():
            os.makedirs(e.path, exist_ok=True)
            with open(os.path.join(e.path, "compile_flags.json"), "w") as f:
                json.dump(flags, f)
        return e


def record_cache(**fields) -> None:
    """FAKE_NXDI_CACHE_CALLS=<file>: one JSON line per bucket (``{"bucket", "hit", "entry"}``)."""
    path = os.environ.get("FAKE_NXDI_CACHE_CALLS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def _split(args: str) -> list[str]:
    import shlex
    return shlex.split(args)
