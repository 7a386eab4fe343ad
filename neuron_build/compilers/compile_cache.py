"""Compile-cache artifacts: ``torch.compile`` warmed on one bucket at build time, captured with
``torch.compiler.save_cache_artifacts()``, installed on a serving host with ``load_cache_artifacts``.

Two backends make this artifact kind (:data:`CACHE_BACKENDS`):

- ``compile-cache`` (this module): ``torch.compile(model, backend="inductor", fullgraph=True,
  dynamic=False)`` on the CPU (or CUDA). It really runs here, so CI tests the whole path.
- ``torchneuron`` (:mod:`neuron_build.compilers.neuron.torchneuron`): ``torch.compile(model,
  backend="neuron", ...)`` of TorchNeuron, whose NEFFs land in ``TORCH_NEURONX_NEFF_CACHE_DIR``.

For these backends the artifact is a *cache*, not a model: serving still needs the user's model, built
from the factory the release records and compiled with the recorded settings (:func:`serving_settings`)
after the cache was installed (:func:`install_caches`). The files:

- ``compile_cache.bin``: the bytes ``torch.compiler.save_cache_artifacts()`` returned (Inductor FX-graph and
  AOT-autograd cache entries, and whatever other caches hook into it) [code: torch 2.13; checked here: a
  fresh process with an empty ``TORCHINDUCTOR_CACHE_DIR`` that loaded the blob reported
  ``fxgraph_cache_hit`` and no miss];
- ``neff_cache/<k[0:2]>/<k[2:4]>/<k>.neff`` (torchneuron only): the NEFF cache folder's files;
- ``inductor_kernels/<xx>/<hash>.so`` (compile-cache): the C++ kernel libraries Inductor built, as they lie
  in ``TORCHINDUCTOR_CACHE_DIR``. The blob does not carry them (checked here, torch 2.13 CPU: a fresh
  process that loaded only the blob reported ``fxgraph_cache_hit`` yet built 11 ``.so`` files for the
  rmsnorm target, a 105 s first call on a loaded 2-core host; with the libraries seeded into its cache
  folder it built none and the first call took 8.6 s). Inductor finds a kernel by the hash of its
  source, so seeding the files under the same relative paths is enough.

Byte stability (checked here, torch 2.13 CPU): two builds of one target give blobs with the same cache
keys and lengths but different bytes: each entry embeds the build's ``TORCHINDUCTOR_CACHE_DIR`` path (in
a repro string) and memory addresses of functions (in AOT-autograd debug lines). The key never depends on
the artifact's bytes, and a release pins the bytes that were built, so this costs nothing but dedup.

Counters read for "did this compile": ``torch._dynamo.utils.counters["inductor"]`` ``fxgraph_cache_hit`` /
``fxgraph_cache_miss`` and ``counters["aot_autograd"]`` ``autograd_cache_hit`` / ``autograd_cache_miss``
[code: torch 2.13]; per graph, ``torch._dynamo.utils.get_compilation_metrics()`` rows (``graph_node_count``,
``graph_op_count``, ``entire_frame_compile_time_s``) [code: torch 2.13].

Torch is imported inside the functions only.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_build.backends import BACKENDS, get_backend
from neuron_build.compilers import graph_key
from neuron_build.compilers.base import (
    EXIT_TOOLCHAIN_MISSING,
    CompileFailed,
    CompilerBase,
    CompileRequest,
    CompileResult,
)
from neuron_build.loaders import CACHE_LOADER
from neuron_build.status import Status

#: our backend -> the Dynamo backend ``torch.compile`` runs (the ``caches`` records of :mod:`neuron_build.backends`).
CACHE_BACKENDS = {b.name: b.torch_compile_backend for b in BACKENDS.values() if b.serving == "caches"}
#: The artifact file holding ``save_cache_artifacts()``'s bytes.
BLOB = "compile_cache.bin"
#: The artifact folder holding the NEFF cache files (torchneuron).
NEFF_DIR = "neff_cache"
#: The artifact folder holding the C++ kernel libraries Inductor built on the CPU (compile-cache).
KERNEL_DIR = "inductor_kernels"
#: The loader a release records for these artifacts.
LOADER = CACHE_LOADER
OP_COUNT_SOURCE = "dynamo graph op count (torch._dynamo.utils.get_compilation_metrics graph_op_count)"


def torch_compile_kwargs(backend: str) -> dict[str, Any]:
    """The ``torch.compile`` keyword arguments of a cache backend (``compile-cache`` or ``torchneuron``):
    ``{"backend": "inductor" | "neuron", "fullgraph": True, "dynamic": False}``. ``fullgraph=True`` makes a
    graph break an error [doc]; TorchNeuron forces ``dynamic=False`` anyway [doc, code].

    Raises:
        KeyError: not a cache backend.
    """
    return {"backend": CACHE_BACKENDS[backend], "fullgraph": True, "dynamic": False}


def compile_counters() -> dict[str, int]:
    """Inductor's and AOT autograd's cache counters of this process so far: ``fxgraph_cache_hit``,
    ``fxgraph_cache_miss``, ``fxgraph_cache_bypass`` (compiled without the cache), ``autograd_cache_hit``, ``autograd_cache_miss`` (ints)."""
    from torch._dynamo.utils import counters

    ind, aot = counters["inductor"], counters["aot_autograd"]
    return {"fxgraph_cache_hit": int(ind.get("fxgraph_cache_hit", 0)),
            "fxgraph_cache_miss": int(ind.get("fxgraph_cache_miss", 0)),
            "fxgraph_cache_bypass": int(ind.get("fxgraph_cache_bypass", 0)),
            "autograd_cache_hit": int(aot.get("autograd_cache_hit", 0)),
            "autograd_cache_miss": int(aot.get("autograd_cache_miss", 0))}


def counter_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """``after - before`` per counter (both from :func:`compile_counters` or a backend's own)."""
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in after}


def graph_rows(since: int = 0) -> list[dict[str, Any]]:
    """Dynamo's per-graph compilation metrics of this process from row ``since`` on: ``graph``
    (``<code name> <compile id>``), ``node_count`` and ``op_count`` (FX graph), ``compile_time_s`` (the
    whole frame, seconds), ``inductor_compile_time_s``, ``fail_reason``."""
    from torch._dynamo.utils import get_compilation_metrics

    rows = []
    for m in list(get_compilation_metrics())[since:]:
        rows.append({"graph": f"{m.co_name} {m.compile_id}", "node_count": m.graph_node_count,
                     "op_count": m.graph_op_count, "compile_time_s": m.entire_frame_compile_time_s,
                     "inductor_compile_time_s": m.inductor_compile_time_s, "fail_reason": m.fail_reason})
    return rows


def n_graph_rows() -> int:
    """How many rows :func:`graph_rows` has now (to read only later ones)."""
    from torch._dynamo.utils import get_compilation_metrics
    return len(list(get_compilation_metrics()))


def graph_break(exc: BaseException) -> str | None:
    """The graph break an exception from a ``fullgraph=True`` compile reports (its first line), or None
    when it is another failure. Dynamo raises ``torch._dynamo.exc.Unsupported`` (or a subclass) for a
    break [code: torch 2.13]."""
    from torch._dynamo.exc import Unsupported

    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, Unsupported):
            text = str(e).strip()
            return (text.splitlines()[0] if text else type(e).__name__)[:300]
        e = e.__cause__
    return None


def sync(device: str) -> None:
    """Wait for the device's queued work: ``torch.cuda.synchronize`` on CUDA, ``torch.neuron.synchronize``
    on a NeuronCore [doc: TorchNeuron], nothing on the CPU."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    elif device.startswith("neuron"):
        torch.neuron.synchronize()  # type: ignore[attr-defined]


def warm(compiled, inputs: tuple, device: str) -> float:
    """Call ``compiled(*inputs)`` once under ``torch.no_grad()`` and synchronise; the wall time in seconds."""
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        compiled(*inputs)
    sync(device)
    return time.perf_counter() - t0


def read_blob(path: Path) -> bytes:
    return Path(path).read_bytes()


def install_caches(blobs: Iterable[Path]) -> dict[str, int]:
    """``torch.compiler.load_cache_artifacts`` of each blob (bytes of :data:`BLOB` files), in order.

    Returns:
        Artifact type -> how many entries were installed (``{"inductor": 2, "aot_autograd": 2}``).

    Raises:
        ValueError: a blob torch could not read (the message names the file).
    """
    import torch

    total: dict[str, int] = {}
    for path in blobs:
        info = torch.compiler.load_cache_artifacts(read_blob(path))
        if info is None:
            raise ValueError(f"{path}: torch.compiler.load_cache_artifacts could not read it "
                             f"(another torch version, or a damaged file)")
        for kind, keys in info.artifacts.items():
            total[kind] = total.get(kind, 0) + len(keys)
    return total


def apply_serving_env(serving: dict[str, Any]) -> dict[str, str]:
    """Set the compiler settings a release recorded (``serving.env``) in ``os.environ`` and return them.
    They must be set before the model is compiled: the literal ``NEURON_CC_FLAGS``, the opt level and the
    LNC are part of TorchNeuron's NEFF cache key [code], Inductor's config is part of its FX-graph key."""
    env = {str(k): str(v) for k, v in (serving.get("env") or {}).items()}
    os.environ.update(env)
    return env


def gather_neff_cache(dirs: list[Path], dest: str | Path | None, neff_dir: str = NEFF_DIR) -> Path:
    """Gather every artifact folder's ``neff_cache/<k[0:2]>/<k[2:4]>/<k>.neff`` into one NEFF cache folder
    (``dest``, default a new temporary folder; files are hard-linked when possible, else copied, and a
    file already there is kept) and point ``TORCH_NEURONX_NEFF_CACHE_DIR`` at it (a POSIX path [code])."""
    import tempfile

    out = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="neuron-build-neff-"))
    for d in dirs:
        src_root = Path(d) / neff_dir
        if not src_root.is_dir():
            continue
        for src in sorted(src_root.rglob("*.neff")):
            dst = out / src.relative_to(src_root)
            if dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(out)
    return out


def kernel_files(cache_dir: Path) -> list[Path]:
    """The C++ kernel libraries (``*.so``) under an Inductor cache folder, sorted."""
    return sorted(p for p in Path(cache_dir).rglob("*.so") if p.is_file())


def seed_kernels(dirs: list[Path], cache_dir: Path) -> int:
    """Copy every artifact folder's ``inductor_kernels/**`` into ``cache_dir`` (the process's
    ``TORCHINDUCTOR_CACHE_DIR``) under the same relative paths; files already there are kept, nothing is
    removed. Returns how many files were added."""
    n = 0
    for d in dirs:
        src_root = Path(d) / KERNEL_DIR
        for src in sorted(src_root.rglob("*")) if src_root.is_dir() else []:
            if not src.is_file():
                continue
            dst = Path(cache_dir) / src.relative_to(src_root)
            if dst.exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
            n += 1
    return n


def inductor_cache_dir() -> Path:
    """This process's Inductor cache folder (``TORCHINDUCTOR_CACHE_DIR`` or Inductor's default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    return Path(cache_dir())


def install_from_caches(dirs: list[Path], serving: Mapping[str, Any], backend: str,
                        neff_cache_dir: str | Path | None = None) -> tuple[dict[str, int], Path | None, dict[str, str]]:
    """Make this process hit the caches of artifact folders before anything is compiled: set the recorded
    ``serving.env`` (:func:`apply_serving_env`); for torchneuron ``import torch_neuronx`` (it registers the
    neuron device, the ``neuron`` backend and its cache hook) and gather the NEFF files into one cache
    folder (:func:`gather_neff_cache`); for compile-cache seed the C++ kernels into the Inductor cache folder
    (:func:`seed_kernels`); then ``load_cache_artifacts`` of every ``compile_cache.bin``. Dynamo's recompile
    limit is raised to cover one graph per folder (``dynamic=False``).

    Returns:
        (installed entries per cache type, the NEFF cache folder or None, the env set).
    """
    import torch

    env = apply_serving_env(serving)
    neff_dir = None
    if backend == "torchneuron":
        import torch_neuronx  # noqa: F401

        neff_dir = gather_neff_cache(dirs, neff_cache_dir)
    installed = install_caches([Path(d) / BLOB for d in dirs if (Path(d) / BLOB).is_file()])
    if backend == "compile-cache":
        installed["cpp_kernels"] = seed_kernels(dirs, inductor_cache_dir())
    limit = max(8, len(dirs) + 1)
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    return installed, neff_dir, env


def compile_from_caches(dirs: list[Path], serving: Mapping[str, Any], backend: str, module,
                        neff_cache_dir: str | Path | None = None):
    """:func:`install_from_caches`, then ``torch.compile(module, **serving["torch_compile"])``.

    Returns:
        (compiled module, installed entries per cache type, the NEFF cache folder or None, the env set).
    """
    import torch

    installed, neff_dir, env = install_from_caches(dirs, serving, backend, neff_cache_dir)
    return torch.compile(module, **serving["torch_compile"]), installed, neff_dir, env


def capture(out_dir: Path) -> dict[str, Any]:
    """Write ``torch.compiler.save_cache_artifacts()`` to ``out_dir/compile_cache.bin``.

    Returns:
        ``{"file", "bytes", "artifacts": {type: [cache keys]}}``.

    Raises:
        CompileFailed: ERROR when nothing was recorded (the compile did not reach a cache).
    """
    import torch

    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        raise CompileFailed(Status.ERROR, "torch.compiler.save_cache_artifacts() recorded nothing: the compile "
                            "reached no cache (is the FX graph cache off? TORCHINDUCTOR_FX_GRAPH_CACHE=0)")
    blob, info = saved
    (out_dir / BLOB).write_bytes(blob)
    return {"file": BLOB, "bytes": len(blob), "artifacts": {k: sorted(v) for k, v in sorted(info.artifacts.items())}}


def fresh_dir(path: Path) -> Path:
    """``path``, emptied (removed if present, then made)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class CompileCacheCompiler(CompilerBase):
    """``torch.compile(backend="inductor", fullgraph=True, dynamic=False)`` warmed on the bucket, captured
    with ``save_cache_artifacts`` into ``compile_cache.bin``, with the C++ kernels under ``inductor_kernels/``.

    The worker is one process per target, so the Inductor cache folder is set for the whole process: a
    fresh ``<work>/inductor-cache`` (``TORCHINDUCTOR_CACHE_DIR``), so that the compile really compiles and
    the blob holds this target's entries, with the FX-graph and AOT-autograd caches on.
    """

    name = "compile-cache"

    def preflight(self, request: CompileRequest) -> None:
        """Point Inductor's caches at a fresh folder in the work dir (before torch compiles anything)."""
        work = Path(request.work_dir).resolve()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(fresh_dir(work / "inductor-cache"))
        os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "1"
        os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "1"

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        """Compile and warm ``model`` on ``example_inputs`` (the bucket's tensors) and capture the caches.

        Raises:
            CompileFailed: TOOLCHAIN_MISSING for ``device = "cuda"`` without CUDA; ERROR ``graph break:
                <reason>`` (details ``graph_break``) when Dynamo breaks the graph; ERROR for any other
                compile failure, or when nothing was captured.
        """
        import torch

        device = request.hardware_target
        if device == "cuda" and not torch.cuda.is_available():
            raise CompileFailed(Status.TOOLCHAIN_MISSING, "device = \"cuda\" but this host has no CUDA device; "
                                "set device = \"cpu\" under [build]", EXIT_TOOLCHAIN_MISSING)
        model = model.to(device)
        inputs = tuple(t.to(device) for t in example_inputs)
        kwargs = torch_compile_kwargs(self.name)
        if get_backend(self.name).graph_key == "before":
            graph_key.checkpoint(request, lambda: self._graph_document(model, inputs, request))
        torch._dynamo.reset()
        before, n0 = compile_counters(), n_graph_rows()
        print(f"torch.compile({kwargs}) on {device}: inputs {[tuple(t.shape) for t in inputs]}", flush=True)
        compiled = torch.compile(model, **kwargs)
        try:
            first_s = warm(compiled, inputs, device)
        except Exception as e:
            brk = graph_break(e)
            if brk:
                raise CompileFailed(Status.ERROR, f"graph break: {brk}", 1, {"graph_break": brk}) from e
            raise
        steady_s = warm(compiled, inputs, device)
        counts = counter_delta(before, compile_counters())
        rows = graph_rows(n0)
        out = Path(request.out_dir)
        blob = capture(out)
        cache_dir = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        kernels = []
        for src in kernel_files(cache_dir):
            rel = f"{KERNEL_DIR}/{src.relative_to(cache_dir).as_posix()}"
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / rel)
            kernels.append(rel)
        ops = sum(int(r["op_count"] or 0) for r in rows) if rows else None
        print(f"warmed in {first_s:.1f} s (then {steady_s * 1000:.2f} ms); graphs {len(rows)}; counters {counts}; "
              f"blob {blob['bytes']} bytes", flush=True)
        return CompileResult(op_count=ops, op_count_source=OP_COUNT_SOURCE if rows else None, details={
            "artifact": BLOB, "loader": LOADER, "artifact_kind": "compile-cache",
            "serving": serving_settings(self.name, request, env=inductor_env(os.environ)),
            "graphs": rows, "cache": blob, "counters": counts, "kernels": kernels,
            "first_call_s": round(first_s, 6), "steady_call_s": round(steady_s, 6),
            "metrics": {"graph_count": len(rows)},
        })


    @staticmethod
    def _graph_document(model, inputs, request: CompileRequest) -> dict:
        """The graph key's document of a compile-cache target: the ``torch.export`` program Dynamo would
        capture, plus what the serving host rebuilds the model from (the factory and its kwargs, recorded
        in the artifact's ``compiler.serving``).

        Raises:
            NoGraphKey: the model does not export as one graph.
        """
        import torch

        try:
            with torch.no_grad():
                ep = torch.export.export(model, inputs, strict=False)
        except Exception as e:
            raise graph_key.NoGraphKey(f"torch.export failed ({type(e).__name__})") from e
        return {**graph_key.export_document(ep),
                "serving": {"factory": request.factory, "kwargs": dict(request.kwargs), "hf": request.hf}}


def inductor_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The graph-changing ``TORCHINDUCTOR_*`` variables of ``environ`` (the key's allow-list,
    :data:`neuron_build.project.keys.KEY_ENV`): a serving host sets them so that its FX-graph keys match."""
    from neuron_build.project.keys import key_env
    return key_env("compile-cache", dict(environ))


def serving_settings(backend: str, request: CompileRequest, env: Mapping[str, str]) -> dict[str, Any]:
    """What a serving host needs to hit this artifact's cache, recorded in the manifest's ``compiler.serving``
    and copied into releases: ``torch_compile`` (:func:`torch_compile_kwargs`), ``env`` (the compiler
    settings that must be set, exactly, before the model is compiled: they are part of TorchNeuron's cache
    key), ``device`` (``cpu``, ``cuda`` or ``neuron``), ``grad`` (``no_grad``: warmed under it), and the model
    as built: ``factory``, ``kwargs``, ``dtype``, and for an hf model ``hf`` (:func:`neuron_build.hf.spec`:
    the folder or package as written in buckets.toml, the auto class, the output, the input names)."""
    device = get_backend(backend).device_kind(request.hardware_target)
    out = {"torch_compile": torch_compile_kwargs(backend), "env": dict(sorted(env.items())), "device": device,
           "grad": "no_grad", "factory": request.factory, "kwargs": dict(request.kwargs), "dtype": request.dtype}
    if request.hf is not None:
        out["hf"] = dict(request.hf)
    return out


__all__ = ["BLOB", "CACHE_BACKENDS", "LOADER", "KERNEL_DIR", "NEFF_DIR", "CompileCacheCompiler", "apply_serving_env", "capture",
           "compile_counters", "compile_from_caches", "gather_neff_cache", "install_from_caches", "inductor_cache_dir", "kernel_files",
           "seed_kernels",
           "counter_delta", "graph_break", "graph_rows", "install_caches", "serving_settings", "sync",
           "torch_compile_kwargs", "warm"]
