"""The key: a sha256 over a canonical JSON of everything that determines a target's artifact.

Components (each hashed on its own so ``explain`` can say which one changed):

- ``format``: the key format version;
- ``model``: factory, kwargs, the source of the factory module and of every module under the models
  folder that it imports, digests of declared weight files and of weight files shipped in the packages
  the model names, and those packages' versions;
- ``inputs``: the target dtype and each input's concrete shape, dtype and range;
- ``compiler``: backend, hardware target, normalised compiler args (without ``--verbose``), profile
  options (``inline_weights_to_neff``, ``tp_degree``);
- ``env``: environment variables that change the compiled graph;
- ``toolchain``: compiler versions (torch; torch-neuronx, neuronx-cc, neuronx-distributed, libneuronxla
  for neuron and torchneuron: TorchNeuron's own NEFF cache key omits them [code], ours does not).

Never in the key: absolute paths, host, user, time, the store location, bytes of saved artifacts. Paths in
the key are relative to the folder of ``buckets.toml``, so a moved checkout computes the same keys.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_build.project.compiler_args import key_args
from neuron_build.project.config import Project
from neuron_build.project.matrix import Target
from neuron_build.project.sources import local_imports
from neuron_build.project.toolchain import NEURON_BACKENDS, resolve_backend, toolchain_versions, version
from neuron_build.util import canonical_json, file_sha256, sha256_hex, write_atomic

KEY_FORMAT = 1
COMPONENTS = ("format", "model", "inputs", "compiler", "env", "toolchain")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".h5", ".msgpack", ".gguf", ".npz", ".npy")
#: Environment variables that change the compiled graph, per backend. [doc: toolchain notes, "Environment"]
ENV_PREFIXES = {
    "neuron": ("NEURON_CC_FLAGS", "XLA_USE_BF16", "XLA_DOWNCAST_BF16", "NEURON_"),
    "torchneuron": ("NEURON_CC_FLAGS", "NEURON_", "TORCH_NEURONX_"),
    "inductor": ("TORCHINDUCTOR_",),
    "compile-cache": ("TORCHINDUCTOR_",),
    "torchscript": ("PYTORCH_JIT",),
}
#: Variables under those prefixes that do not change the artifact (runtime, cache and log settings).
ENV_IGNORED_PREFIXES = ("NEURON_RT_", "NEURON_COMPILE_CACHE_URL", "TORCHINDUCTOR_CACHE_DIR",
                        "TORCHINDUCTOR_COMPILE_THREADS", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE",
                        "NEURON_BUILD_", "TORCH_NEURONX_NEFF_CACHE_DIR", "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR",
                        "TORCH_NEURONX_METRICS_DIR", "TORCH_NEURONX_DEBUG_DIR", "TORCH_NEURONX_ENABLED_METRIC_TABLES",
                        "TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS")


class DigestCache:
    """sha256 digests of large files, cached by (path, size, mtime_ns, inode) in a JSON file.

    A no-op build stats each weight file instead of reading it. The cache file lives in the project's state
    folder; a missing or corrupt cache file is treated as empty. Writes are atomic (temp file + rename).
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._data: dict[str, list] = {}
        self._dirty = False
        if path is not None:
            try:
                self._data = json.loads(path.read_text())
            except (OSError, ValueError):
                self._data = {}

    def digest(self, file: Path) -> str:
        st = file.stat()
        sig = [st.st_size, st.st_mtime_ns, st.st_ino]
        ent = self._data.get(str(file))
        if ent and ent[:3] == sig:
            return ent[3]
        d = file_sha256(file)
        self._data[str(file)] = [*sig, d]
        self._dirty = True
        return d

    def save(self) -> None:
        if not self._dirty or self.path is None:
            return
        write_atomic(self.path, json.dumps(self._data).encode())
        self._dirty = False


@dataclass(frozen=True)
class KeyInfo:
    """A target's key and the details it was computed from.

    ``details`` maps each component name to its JSON value; ``hashes`` maps it to its sha256; ``key`` is
    the sha256 of the canonical JSON of ``details`` (64 hex chars).
    """

    key: str
    details: dict[str, Any]
    hashes: dict[str, str]


def diff_components(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The components whose hashes differ, in :data:`COMPONENTS` order, each with the sub-keys that
    changed: ``["model: sources[models/ffn.py]", ...]``."""
    out = []
    for c in COMPONENTS:
        a, b = old.get(c), new.get(c)
        if canonical_json(a) == canonical_json(b):
            continue
        detail = _subdiff(a, b)
        out.append(f"{c}: {detail}" if detail else c)
    return out


def _subdiff(a: Any, b: Any, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        parts = []
        for k in sorted(set(a) | set(b), key=str):
            if canonical_json(a.get(k)) != canonical_json(b.get(k)):
                sub = _subdiff(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
                parts.append(sub or (f"{prefix}.{k}" if prefix else str(k)))
        return ", ".join(parts)
    return ""


class KeyMaker:
    """Computes keys for a project's targets, caching the per-model and per-build parts.

    Cheap on the no-op path: no torch import, model sources read once per model, weight files digested
    once and then cached by (path, size, mtime_ns, inode).
    """

    def __init__(self, project: Project, backend: str | None = None, environ: dict[str, str] | None = None):
        self.project = project
        build = project.config.build
        self.backend, self.backend_note = resolve_backend(backend or build.backend, build.target)
        self.hardware_target = build.target if self.backend in NEURON_BACKENDS else build.device
        self.environ = dict(os.environ if environ is None else environ)
        self.digests = DigestCache(project.state_dir / "digests.json")
        self._model_cache: dict[str, dict[str, Any]] = {}
        self._toolchain = toolchain_versions(self.backend)
        self._env = self._env_component()

    def _env_component(self) -> dict[str, str]:
        prefixes = ENV_PREFIXES.get(self.backend, ())
        return {k: v for k, v in sorted(self.environ.items())
                if k.startswith(prefixes) and not k.startswith(ENV_IGNORED_PREFIXES)}

    def model_component(self, name: str) -> dict[str, Any]:
        """The ``model`` component of one model (cached)."""
        if name in self._model_cache:
            return self._model_cache[name]
        p = self.project
        m = p.config.models[name]
        root = p.root
        entry = p.factory_file(name)
        top = root / m.module.split(".")[0]
        if not top.is_dir():
            top = entry.parent
        sources = {f.relative_to(root).as_posix(): file_sha256(f) for f in local_imports(entry, top)}
        weights = {w: self.digests.digest(root / w) for w in m.weights}
        packages: dict[str, Any] = {}
        for dist_name in m.packages:
            dist = md.distribution(dist_name)
            files = sorted(f for f in (dist.files or []) if str(f).endswith(WEIGHT_SUFFIXES))
            packages[dist_name] = {
                "version": dist.version,
                "weights": {str(f): self.digests.digest(Path(dist.locate_file(f))) for f in files},
            }
        comp = {"factory": m.factory, "kwargs": m.kwargs, "sources": sources, "weights": weights,
                "packages": packages}
        self._model_cache[name] = comp
        return comp

    def details(self, target: Target) -> dict[str, Any]:
        """The key details of a target: a dict of the components in :data:`COMPONENTS`."""
        cfg = self.project.config
        m = cfg.models[target.model]
        prof = cfg.profiles[target.profile]
        return {
            "format": KEY_FORMAT,
            "model": self.model_component(target.model),
            "inputs": {"dtype": target.dtype, "inputs": [i.to_json() for i in target.inputs(m)]},
            "compiler": {"backend": self.backend, "hardware_target": self.hardware_target,
                         "compiler_args": list(key_args(prof.compiler_args)),
                         "inline_weights_to_neff": prof.inline_weights_to_neff, "tp_degree": prof.tp_degree},
            "env": self._env,
            "toolchain": self._toolchain,
        }

    def key(self, target: Target) -> KeyInfo:
        """The target's :class:`KeyInfo`."""
        d = self.details(target)
        return KeyInfo(key=sha256_hex(canonical_json(d)), details=d,
                       hashes={c: sha256_hex(canonical_json(d[c])) for c in COMPONENTS})

    def save(self) -> None:
        """Persist the digest cache (call once after computing keys)."""
        self.digests.save()


__all__ = ["KeyMaker", "KeyInfo", "COMPONENTS", "diff_components", "canonical_json", "file_sha256", "version"]
