"""Test double of TorchNeuron, the native torch-neuronx (neuron-build tests/fakes; see tests/fakes/README.md).

Importing it, like the real package [doc: TorchNeuron registers Trainium as the PyTorch device `neuron`
through PrivateUse1]:

- renames the PrivateUse1 backend to ``neuron`` and registers the device module ``torch.neuron``
  (``synchronize``, ``is_available`` -> False, ``device_count`` -> 0: no tensor can live on the fake
  device, so neuron-build's compile-only path runs on CPU tensors);
- registers the Dynamo backend ``neuron``: it "compiles" each graph into a NEFF file of
  ``TORCH_NEURONX_NEFF_CACHE_DIR`` (default ``/tmp/neff_cache``) at ``<k[0:2]>/<k[2:4]>/<k>.neff``, written to a
  temporary name and renamed, keyed on the FX graph's code, the input shapes and dtypes, the platform
  target, the LNC, the opt level and the literal ``NEURON_CC_FLAGS`` (not the compiler or torch-neuronx
  version) [code], and runs the graph eagerly. A hit reads the file and compiles nothing.
- registers a ``neuron_neff`` cache artifact type with ``torch.compiler``'s cache manager, so
  ``save_cache_artifacts()`` carries the NEFFs and ``load_cache_artifacts()`` writes them into the
  ``TORCH_NEURONX_NEFF_CACHE_DIR`` of the loading process [code: TorchNeuron hooks its NEFFs into it].

Switches (environment, read at each compile): ``FAKE_TORCHNEURON_FAIL=compile`` fails every compile
(``RuntimeError: neuronx-cc failed with 1: [NCC_EUOC002] ...``; with
``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION`` other than ``1`` the graph runs eagerly instead, with a
warning); ``FAKE_TORCHNEURON_GRAPH_BREAK=1`` (read at import) installs a global module forward pre-hook
that calls ``torch._dynamo.graph_break()``, so a ``fullgraph=True`` compile raises ``Unsupported``;
``FAKE_TORCHNEURON_SLEEP`` seconds per compile; ``FAKE_TORCHNEURON_CALLS`` a file receiving one JSON line
per graph compile (``{"key", "hit", "pid"}``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import struct
import tarfile
import time
import types
import uuid
import warnings
from pathlib import Path

import torch

__version__ = "2.13.3.4217"
COMPILER_VERSION = "2.30.4217.0+5e1f0c2a"
NEFF_HEADER = struct.Struct("<QQQQQ128sI32s16s256sI64sQI468s")
_METRICS: list[dict] = []
_GRAPHS = [0]


# --------------------------------------------------------------------------- the neuron device
def _synchronize(device=None) -> None:
    """Wait for the (fake) NeuronCore: nothing is queued."""


_device_module = types.ModuleType("torch.neuron")
_device_module.synchronize = _synchronize
_device_module.is_available = lambda: False
_device_module.device_count = lambda: 0

if torch._C._get_privateuse1_backend_name() == "privateuseone":
    torch.utils.rename_privateuse1_backend("neuron")
if not hasattr(torch, "neuron"):
    torch._register_device_module("neuron", _device_module)


# --------------------------------------------------------------------------- NEFF cache
def neff_cache_dir() -> Path:
    return Path(os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR") or "/tmp/neff_cache")


def cache_key(gm, example_inputs) -> str:
    """The NEFF cache key: graph code, input shapes/dtypes, target, LNC, opt level, literal NEURON_CC_FLAGS."""
    h = hashlib.sha256()
    h.update(gm.code.encode())
    for t in example_inputs:
        h.update(f"|{tuple(getattr(t, 'shape', ()))}:{getattr(t, 'dtype', type(t).__name__)}".encode())
    for var, default in (("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2"), ("NEURON_LOGICAL_NC_CONFIG", "2"),
                         ("NEURON_COMPILER_OPT_LEVEL", "2"), ("NEURON_CC_FLAGS", "")):
        h.update(f"|{var}={os.environ.get(var, default)}".encode())
    return h.hexdigest()


def neff_path(key: str, root: Path | None = None) -> Path:
    root = neff_cache_dir() if root is None else root
    return root / key[0:2] / key[2:4] / f"{key}.neff"


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)


def build_neff(key: str, name: str, node_count: int) -> bytes:
    """A well-formed NEFF: the 1024-byte header and a gzip'd tar holding ``neff.json``."""
    lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2"))
    meta = {"producer": "fake TorchNeuron (neuron-build test double)", "key": key, "graph": name,
            "node_count": node_count, "flags": os.environ.get("NEURON_CC_FLAGS", ""),
            "opt_level": os.environ.get("NEURON_COMPILER_OPT_LEVEL", "2"), "lnc": lnc}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        body = json.dumps(meta, sort_keys=True).encode()
        info = tarfile.TarInfo("neff.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    payload = io.BytesIO()
    with gzip.GzipFile(fileobj=payload, mode="wb", mtime=0, compresslevel=1) as gz:
        gz.write(raw.getvalue())
    data = payload.getvalue()
    header = NEFF_HEADER.pack(1, NEFF_HEADER.size, len(data), 2, 0, COMPILER_VERSION.encode(), lnc,
                              hashlib.sha256(data).digest(), uuid.uuid4().bytes, name.encode()[:256], lnc, b"", 0,
                              lnc, b"")
    return header + data


# --------------------------------------------------------------------------- the cache artifact hook
from torch.compiler._cache import CacheArtifact, CacheArtifactFactory, CacheArtifactManager  # noqa: E402


class NeuronNeffArtifact(CacheArtifact):
    """A NEFF carried by ``torch.compiler.save_cache_artifacts()``; installed into the NEFF cache folder."""

    def populate_cache(self) -> None:
        _write_atomic(neff_path(self.key), self.content)

    @staticmethod
    def type() -> str:
        return "neuron_neff"


if "neuron_neff" not in CacheArtifactFactory._artifact_types:
    CacheArtifactFactory.register(NeuronNeffArtifact)


# --------------------------------------------------------------------------- the Dynamo backend
def _record_call(key: str, hit: bool) -> None:
    calls = os.environ.get("FAKE_TORCHNEURON_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(json.dumps({"key": key, "hit": hit, "pid": os.getpid()}) + "\n")


def neuron_backend(gm, example_inputs):
    """The ``neuron`` Dynamo backend: NEFF from the cache or "compiled" into it; the graph runs eagerly."""
    t0 = time.perf_counter()
    _GRAPHS[0] += 1
    name = f"graph_{_GRAPHS[0]}"
    nodes = len(gm.graph.nodes)
    key = cache_key(gm, example_inputs)
    path = neff_path(key)
    disabled = os.environ.get("TORCH_NEURONX_NEFF_DISABLE_CACHE") == "1"
    hit = not disabled and path.is_file()
    row = {"graph_name": name, "node_count": nodes, "compile_time_us": 0, "cache_hit": hit, "neff_key": key}
    if hit:
        neff = path.read_bytes()
    else:
        if os.environ.get("FAKE_TORCHNEURON_FAIL") == "compile":
            msg = (f"neuronx-cc failed with 1: [NCC_EUOC002] The operator in {name} has no implementation for "
                   f"{os.environ.get('NEURON_PLATFORM_TARGET_OVERRIDE', 'trn2')}")
            row["compile_time_us"] = int((time.perf_counter() - t0) * 1e6)
            row["error"] = msg
            _METRICS.append(row)
            if os.environ.get("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION") == "1":
                raise RuntimeError(msg)
            warnings.warn(f"{msg}; running {name} eagerly (fallback execution)", stacklevel=2)
            return gm.forward
        time.sleep(float(os.environ.get("FAKE_TORCHNEURON_SLEEP", "0") or 0))
        neff = build_neff(key, name, nodes)
        if not disabled:
            _write_atomic(path, neff)
        row["compile_time_us"] = int((time.perf_counter() - t0) * 1e6)
    CacheArtifactManager.record_artifact("neuron_neff", key, neff)
    _METRICS.append(row)
    _record_call(key, hit)
    _ACTIVE_GRAPHS[key] = neff

    def run(*args):
        from torch_neuronx import profiling
        profiling._on_graph_call(key)
        return gm.forward(*args)

    return run


_ACTIVE_GRAPHS: dict[str, bytes] = {}

if "neuron" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(neuron_backend, name="neuron")


def get_dynamo_metrics() -> list[dict]:
    """One row per graph this process compiled (or found cached): ``graph_name``, ``node_count``,
    ``compile_time_us``, ``cache_hit``, ``neff_key``."""
    return [dict(r) for r in _METRICS]


if os.environ.get("FAKE_TORCHNEURON_GRAPH_BREAK") == "1":
    def _break(module, args):
        torch._dynamo.graph_break()

    torch.nn.modules.module.register_module_forward_pre_hook(_break)

from torch_neuronx import profiling  # noqa: E402

__all__ = ["get_dynamo_metrics", "neuron_backend", "profiling"]
