"""The torchneuron backend: TorchNeuron's ``torch.compile(model, backend="neuron")`` warmed on one bucket,
its NEFF cache and compile-cache blob captured as the artifact (runs in the worker subprocess).

Neuron facts used here, tagged as in :mod:`neuron_build.compilers.neuron.neuronx_log` (the user's view is
``docs/neuron.md``, "The TorchNeuron path"):

- TorchNeuron registers Trainium as the PyTorch device ``neuron`` (PrivateUse1) and the Dynamo backend
  ``neuron``; public beta in Neuron 2.33 for trn2 and trn3, torch 2.13/2.14 [doc]. The wheel keeps the
  name ``torch-neuronx``; the XLA library of the same name has ``torch_neuronx.trace``. Told apart by API
  (:func:`neuron_build.project.toolchain.torch_neuronx_api`) [guess: probe both].
- Dynamo -> AOT Autograd -> StableHLO -> neuronx-cc (a subprocess in a temporary folder that is deleted)
  -> NEFF; ``dynamic=False`` forced; each new input signature compiles again [doc, code]. ``fullgraph=True``
  turns graph breaks into errors [doc].
- Compiler settings are process-wide environment variables: ``NEURON_CC_FLAGS`` (extra flags),
  ``NEURON_COMPILER_OPT_LEVEL`` (default ``-O2``), ``NEURON_LOGICAL_NC_CONFIG`` [code]. Set here from the
  profile's normalised compiler args, in their stable (sorted) order, because the literal flag string is
  part of TorchNeuron's own cache key [code]: ``--optlevel=N`` becomes ``NEURON_COMPILER_OPT_LEVEL=N``
  [guess: the value's spelling], ``--lnc=N`` becomes ``NEURON_LOGICAL_NC_CONFIG=N``, the others are joined
  by spaces into ``NEURON_CC_FLAGS`` (followed by the ``NEURON_CC_FLAGS`` of the build's environment, which
  is in our key).
- ``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=1``: a graph that fails to compile raises instead of running
  eagerly; its default changed during 2026, so it is always set [doc, code].
- NEFF cache: ``TORCH_NEURONX_NEFF_CACHE_DIR`` holding ``<key[0:2]>/<key[2:4]>/<key>.neff``, per-key lock
  files in ``TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`` [code, April 2026 source]. Both are set to fresh folders
  of the work dir, so every NEFF there was compiled by this target.
- ``torch.compiler.save_cache_artifacts()`` holds what the process compiled, NEFFs included [code].
- ``torch_neuronx.get_dynamo_metrics()``: rows with graph name, FX node count and compile time in
  microseconds [code]. The row's field names are not documented: :func:`metric_row` reads the likely
  spellings [guess].
- Compiling without a NeuronCore: ``TORCH_NEURONX_COMPILE_ONLY=1`` is seen only in third-party code
  [guess: verify on a host]. Without ``/dev/neuron*`` this backend sets it and warms on CPU tensors; the
  manifest says ``compile_only: true``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import (
    EXIT_TOOLCHAIN_MISSING,
    CompileFailed,
    CompilerBase,
    CompileRequest,
    CompileResult,
)
from neuron_build.compilers.compile_cache import (
    BLOB,
    LOADER,
    NEFF_DIR,
    capture,
    fresh_dir,
    graph_break,
    serving_settings,
    torch_compile_kwargs,
    warm,
)
from neuron_build.project.toolchain import NEURON_INSTALL_HINT, neuron_devices, neuron_status, version
from neuron_build.status import Status

OP_COUNT_SOURCE = "torch_neuronx.get_dynamo_metrics node count"
#: Environment variables this backend sets, in the order they are reported.
SETTINGS_ENV = ("NEURON_CC_FLAGS", "NEURON_COMPILER_OPT_LEVEL", "NEURON_LOGICAL_NC_CONFIG",
                "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "TORCH_NEURONX_COMPILE_ONLY")


def compiler_env(compiler_args: list[str], environ: dict[str, str] | os._Environ, *, compile_only: bool) -> dict[str, str]:
    """The TorchNeuron compiler settings for a profile's normalised compiler args (see the module docstring).

    Args:
        compiler_args: normalised (``--flag=value``, sorted) as the config stores them.
        environ: the build's environment (its ``NEURON_CC_FLAGS`` is appended).
        compile_only: no NeuronCore here: also ``TORCH_NEURONX_COMPILE_ONLY=1`` [guess].

    Returns:
        Variable -> value; ``NEURON_CC_FLAGS`` only when there are flags.
    """
    flags, env = [], {}
    for a in compiler_args:
        flag, _, value = a.partition("=")
        if flag == "--optlevel":
            env["NEURON_COMPILER_OPT_LEVEL"] = value
        elif flag == "--lnc":
            env["NEURON_LOGICAL_NC_CONFIG"] = value
        elif flag != "--target":
            flags.append(a)
    extra = (environ.get("NEURON_CC_FLAGS") or "").strip()
    if extra:
        flags.append(extra)
    if flags:
        env["NEURON_CC_FLAGS"] = " ".join(flags)
    env["TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION"] = "1"
    if compile_only:
        env["TORCH_NEURONX_COMPILE_ONLY"] = "1"
    return {k: env[k] for k in SETTINGS_ENV if k in env}


def metric_row(row: Any) -> dict[str, Any]:
    """One ``get_dynamo_metrics()`` row as ``{"graph", "node_count", "compile_time_s", "cache_hit", "error"}``
    (seconds from the row's microseconds). Rows may be dicts or objects [guess: field spellings]."""
    def get(*names: str) -> Any:
        for n in names:
            v = row.get(n) if isinstance(row, dict) else getattr(row, n, None)
            if v is not None:
                return v
        return None

    us = get("compile_time_us", "compile_time_usec", "compilation_time_us")
    return {"graph": get("graph_name", "name", "graph"), "node_count": get("node_count", "num_nodes", "fx_node_count"),
            "compile_time_s": round(float(us) / 1e6, 6) if us is not None else None,
            "cache_hit": get("cache_hit", "neff_cache_hit"), "error": get("error", "compile_error")}


def dynamo_metrics() -> list[dict[str, Any]]:
    """``torch_neuronx.get_dynamo_metrics()`` as :func:`metric_row` rows ([] when it has none)."""
    import torch_neuronx

    fn = getattr(torch_neuronx, "get_dynamo_metrics", None)
    rows = fn() if callable(fn) else []
    if isinstance(rows, dict):
        rows = rows.get("graphs") or list(rows.values())
    return [metric_row(r) for r in rows or []]


def neff_files(cache_dir: Path) -> list[Path]:
    """The NEFFs of a NEFF cache folder (``<k[0:2]>/<k[2:4]>/<k>.neff``), sorted; temporary files skipped."""
    return sorted(p for p in cache_dir.rglob("*.neff") if p.is_file() and not p.name.startswith("."))


def native_api_problem() -> str | None:
    """Why the imported torch_neuronx is not TorchNeuron (the native backend), or None when it is. Called in
    the worker after ``import torch_neuronx``: the native one registers the ``neuron`` device [guess: probe]."""
    import torch
    import torch_neuronx

    if torch._C._get_privateuse1_backend_name() == "neuron" and hasattr(torch, "neuron"):
        return None
    if callable(getattr(torch_neuronx, "trace", None)):
        return (f"the installed torch-neuronx {version('torch-neuronx')} is the XLA library (it has "
                "torch_neuronx.trace and registers no neuron device); backend torchneuron needs TorchNeuron, the "
                "native backend (Neuron 2.33+, trn2/trn3): install it, or set backend = \"neuron\" for the XLA path")
    return ("The Neuron toolchain is not installed (found the PyPI placeholder: torch_neuronx has neither trace nor "
            f"the neuron device); uninstall it and {NEURON_INSTALL_HINT}.")


class TorchNeuronCompiler(CompilerBase):
    """``torch.compile(model, backend="neuron", fullgraph=True, dynamic=False)`` run once on the bucket's
    example inputs on the ``neuron`` device (CPU tensors without a NeuronCore, compile-only), synchronised;
    the NEFF cache files, the ``save_cache_artifacts()`` blob and the per-graph metrics are the artifact."""

    name = "torchneuron"

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.devices: list[str] = []

    def preflight(self, request: CompileRequest) -> None:
        """Set the process-wide compiler settings and fresh cache folders, then import torch_neuronx and
        check it is the native one.

        Raises:
            CompileFailed: TOOLCHAIN_MISSING (exit 3) with one sentence: no or placeholder toolchain, torch
                mismatch, an import failure, or the XLA torch-neuronx.
        """
        st = neuron_status()
        if not st.usable:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, st.problem or "the Neuron toolchain is not usable",
                                EXIT_TOOLCHAIN_MISSING, {"toolchain": st.versions, "kind": st.kind})
        work = Path(request.work_dir).resolve()
        self.devices = neuron_devices()
        self.env = compiler_env(request.compiler_args, os.environ, compile_only=not self.devices)
        os.environ.update(self.env)
        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(fresh_dir(work / "neff-cache"))
        os.environ["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] = str(fresh_dir(work / "neff-locks"))
        try:
            import torch_neuronx  # noqa: F401  registers the neuron device and Dynamo backend
        except Exception as e:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, f"torch_neuronx does not import ({type(e).__name__}: "
                                f"{str(e).strip()[:200]}); {NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING) from e
        problem = native_api_problem()
        if problem:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, problem, EXIT_TOOLCHAIN_MISSING)

    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        """Warm ``model`` on ``example_inputs`` and capture the NEFF cache and blob into ``request.out_dir``.

        Raises:
            CompileFailed: ERROR ``graph break: <reason>`` (details ``graph_break``); ERROR ``compile failed:
                <first line>`` (details ``exception``, the metrics rows so far) for a failing graph.
        """
        import torch

        from neuron_build.compilers.neuron.neff import NeffError, read_neff_header

        cache = Path(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"])
        device = "neuron" if self.devices else "cpu"
        model = model.to(device)
        inputs = tuple(t.to(device) for t in example_inputs)
        kwargs = torch_compile_kwargs(self.name)
        print(f"torch.compile({kwargs}) on {device}; env {self.env}", flush=True)
        torch._dynamo.reset()
        compiled = torch.compile(model, **kwargs)
        try:
            first_s = warm(compiled, inputs, device)
        except Exception as e:
            brk = graph_break(e)
            if brk:
                raise CompileFailed(Status.ERROR, f"graph break: {brk}", 1, {"graph_break": brk}) from e
            root = root_cause(e)
            first = (str(root).strip().splitlines() or [type(root).__name__])[0][:300]
            raise CompileFailed(Status.ERROR, f"compile failed: {type(root).__name__}: {first}", 1,
                                {"exception": f"{type(root).__name__}: {first}", "graphs": _safe_metrics()}) from e
        steady_s = warm(compiled, inputs, device)
        rows = dynamo_metrics()
        out = Path(request.out_dir)
        neffs: dict[str, Any] = {}
        for src in neff_files(cache):
            rel = f"{NEFF_DIR}/{src.relative_to(cache).as_posix()}"
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            try:
                neffs[rel] = read_neff_header(dst).to_json()
            except NeffError as e:
                raise CompileFailed(Status.ERROR, f"the compiled {rel} is not a valid NEFF: {e}") from e
        if not neffs:
            raise CompileFailed(Status.ERROR, f"torch.compile(backend=\"neuron\") ran but wrote no NEFF into "
                                f"TORCH_NEURONX_NEFF_CACHE_DIR ({cache})")
        blob = capture(out)
        nodes = [r["node_count"] for r in rows if r["node_count"] is not None]
        times = [r["compile_time_s"] for r in rows if r["compile_time_s"] is not None]
        print(f"warmed in {first_s:.1f} s; graphs {len(rows)}; NEFFs {sorted(neffs)}", flush=True)
        return CompileResult(op_count=sum(nodes) if nodes else None, op_count_source=OP_COUNT_SOURCE if nodes else None,
                             details={
            "artifact": BLOB, "loader": LOADER, "artifact_kind": "compile-cache",
            "serving": serving_settings(self.name, request,
                                        {k: v for k, v in self.env.items() if k != "TORCH_NEURONX_COMPILE_ONLY"}),
            "build_device": device,
            "neff": neffs, "graphs": rows, "cache": blob, "compile_only": not self.devices,
            "neuron_devices": list(self.devices), "env": dict(self.env),
            "first_call_s": round(first_s, 6), "steady_call_s": round(steady_s, 6),
            "compiler_compile_time_s": round(sum(times), 6) if times else None,
            "metrics": {"graph_count": len(rows), "neff_count": len(neffs),
                        "compiler_compile_time_s": round(sum(times), 6) if times else None},
        })


def root_cause(exc: BaseException) -> BaseException:
    """The backend's own exception inside Dynamo's wrapper (``BackendCompilerFailed.inner_exception``, else
    the ``__cause__`` chain) [code: torch 2.13]."""
    seen = set()
    e = exc
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if inner is None:
            break
        e = inner
    return e


def _safe_metrics() -> list[dict[str, Any]]:
    try:
        return dynamo_metrics()
    except Exception:  # metrics are a nicety on the failure path
        return []


__all__ = ["OP_COUNT_SOURCE", "SETTINGS_ENV", "TorchNeuronCompiler", "compiler_env", "dynamo_metrics", "metric_row",
           "native_api_problem", "neff_files"]
