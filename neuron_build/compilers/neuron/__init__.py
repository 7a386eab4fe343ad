"""The neuron backend: ``torch_neuronx.trace`` + ``neuronx-cc`` (runs in the worker subprocess).

One target, TP degree 1::

    torch_neuronx.trace(model, example_inputs, compiler_workdir=<work>/neuron,
                        compiler_args=[<profile args>, "--target", <trn1|trn2|inf2...>,
                                       "--logfile=<work>/neuron/log-neuron-cc.txt"],
                        inline_weights_to_neff=<profile>, cpu_backend=<True without a NeuronCore>)

then ``torch.jit.save`` as ``model.pt``, ``<workdir>/graph.neff`` copied as ``model.neff``, the compiler
log as ``compile.log`` and ``<workdir>/command.txt`` as ``command.txt``. A profile with ``tp_degree > 1``
goes through ``neuronx_distributed.trace.parallel_model_trace`` and ``parallel_model_save``: ``tp_<r>.pt``,
``tp_<r>.neff``, ``tp_<r>.compile.log`` and ``tp_<r>.command.txt`` per rank r.

Neuron facts used here, tagged as in :mod:`neuron_build.compilers.neuron.neuronx_log` (the user's view is
``docs/neuron.md``, "The XLA path"):

- The ``trace`` signature and its history: 2.7 had only ``compiler_workdir`` and ``compiler_args``;
  2.16 added ``input_output_aliases``, ``partitioner_config``, ``inline_weights_to_neff``; 2.21 added
  ``cpu_backend`` [doc]. Unknown keyword arguments only produce a warning [seen], so the signature is
  probed and only the parameters it names are passed; a ``**kwargs`` catch-all does not count.
- ``cpu_backend=True`` traces without a Neuron device and needs ``--target`` in ``compiler_args`` [doc];
  it is passed as two items (``--target``, ``trn1``) because the check for it may look for the bare flag
  [guess].
- The NEFF in the workdir is ``graph.neff`` [doc]; ``command.txt`` and ``model/graph.hlo`` [seen].
- ``--logfile=<absolute path>`` pins the log (default ``log-neuron-cc.txt`` in the compiler's cwd) [doc].
- When the compiler fails, trace raises ``RuntimeError("neuronx-cc failed with <status>")`` [seen]; status
  70 is a transient tool failure [seen]; a negative status is the signal that killed it (-9: SIGKILL,
  usually the out-of-memory killer) [guess: subprocess convention].
- ``parallel_model_trace(func, example_inputs, compiler_workdir, compiler_args, inline_weights_to_neff,
  tp_degree=...)`` calls ``func()`` for ``(model, input_output_aliases)`` once per rank and compiles each
  rank in ``<workdir>/_tp<rank>/``; ``parallel_model_save(model, dir)`` writes ``tp_<rank>.pt`` [doc, code].
  NxD pins each rank's log at ``_tp<rank>/log-neuron-cc.txt`` itself [guess], so no ``--logfile`` is
  passed there. Ranks may run in spawned processes [guess], so ``func`` is a picklable factory that
  rebuilds the model from its factory rather than a closure.
- Saved models load only after ``import torch_neuronx`` (they hold a ``torch.classes.neuron.Model``) [doc].
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuron_build.compilers import graph_key
from neuron_build.compilers.base import (
    EXIT_TOOLCHAIN_MISSING,
    CompileFailed,
    CompilerBase,
    CompileRequest,
    CompileResult,
    enter_stage,
)
from neuron_build.compilers.neuron.failure import (
    EXIT_KILLED,
    EXIT_TRANSIENT,
    classify_failure,
    first_line,
    log_digest,
)
from neuron_build.compilers.neuron.neuronx_log import LogSummary
from neuron_build.compilers.neuron.outputs import (
    LOG_NAME,
    SOURCE_ANALYZE,
    SOURCE_HLO,
    SOURCE_LOG,
    analyze_op_count,
    collect_ranks,
    save_model,
)
from neuron_build.compilers.neuron.trace import (
    ADDED_IN,
    ChildPeakMonitor,
    RankModelFactory,
    plan_trace_kwargs,
    signature_params,
)
from neuron_build.loaders import NEURON_JIT_LOADER, NEURON_TP_LOADER
from neuron_build.project.toolchain import (
    NEURON_INSTALL_HINT,
    CompilerExecutable,
    compiler_executable,
    neuron_devices,
    neuron_status,
    version,
)
from neuron_build.status import Status


def graph_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change a Neuron compile (as the key counts them), sorted."""
    from neuron_build.project.keys import key_env
    return key_env("neuron", dict(environ))


class NeuronCompiler(CompilerBase):
    """``torch_neuronx.trace`` (TP degree 1) or ``neuronx_distributed.trace.parallel_model_trace``."""

    name = "neuron"

    def __init__(self) -> None:
        self._ready = False
        self.executable: CompilerExecutable | None = None
        self.devices: list[str] = []
        self.warnings: list[str] = []

    # -- before the model is built ---------------------------------------------------------------
    def preflight(self, request: CompileRequest) -> None:
        """Check the toolchain before the model is built (cheap failures first).

        Raises:
            CompileFailed: ``TOOLCHAIN_MISSING`` (exit 3) with one sentence naming what is missing and
                how to install it: no torch-neuronx, the PyPI placeholder, a torch mismatch, no
                ``neuronx-cc`` on PATH, a module without ``trace``, or neuronx-distributed missing for
                ``tp_degree > 1``.
        """
        if self._ready:
            return
        st = neuron_status()
        if not st.usable:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, st.problem or "the Neuron toolchain is not usable",
                                EXIT_TOOLCHAIN_MISSING, {"toolchain": st.versions, "kind": st.kind})
        exe = compiler_executable()
        if exe.path is None:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, f"The neuronx-cc compiler executable is not on PATH although "
                                f"neuronx-cc {st.versions['neuronx-cc']} is installed; activate the environment "
                                f"it was installed into or {NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING)
        self.executable = exe
        if exe.error:
            self.warnings.append(exe.error)
        elif exe.version != st.versions["neuronx-cc"]:
            self.warnings.append(f"neuronx-cc on PATH ({exe.path}) reports {exe.version} but the installed "
                                 f"neuronx-cc package is {st.versions['neuronx-cc']}")
        try:
            import torch_neuronx
        except Exception as e:  # ImportError, or a broken build raising anything at import
            raise CompileFailed(Status.TOOLCHAIN_MISSING, f"torch_neuronx does not import ({type(e).__name__}: "
                                f"{first_line(e)}); {NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING) from e
        if not callable(getattr(torch_neuronx, "trace", None)):
            raise CompileFailed(Status.TOOLCHAIN_MISSING, "The Neuron toolchain is not installed (found the PyPI "
                                "placeholder: torch_neuronx has no trace); uninstall it and "
                                f"{NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING)
        if request.tp_degree > 1:
            try:
                import neuronx_distributed.trace  # noqa: F401
            except Exception as e:
                raise CompileFailed(Status.TOOLCHAIN_MISSING, f"profile {_profile(request)} sets tp_degree = "
                                    f"{request.tp_degree}, which needs neuronx-distributed, and it does not import "
                                    f"({type(e).__name__}: {first_line(e)}); {NEURON_INSTALL_HINT}.",
                                    EXIT_TOOLCHAIN_MISSING) from e
        self.devices = neuron_devices()
        # plan once here so that a profile the version cannot honour fails before the model is built
        self._kwargs(request, Path(request.work_dir).resolve() / "neuron")
        self._ready = True

    def _trace_fn(self, request: CompileRequest):
        if request.tp_degree > 1:
            from neuronx_distributed.trace import parallel_model_trace
            return parallel_model_trace, "neuronx_distributed.trace.parallel_model_trace"
        import torch_neuronx
        return torch_neuronx.trace, "torch_neuronx.trace"

    def _kwargs(self, request: CompileRequest, workdir: Path) -> dict[str, Any]:
        fn, api = self._trace_fn(request)
        args = list(request.compiler_args) + ["--target", request.hardware_target]
        if request.tp_degree == 1:
            args.append(f"--logfile={workdir / LOG_NAME}")
        kwargs = plan_trace_kwargs(signature_params(fn), profile=_profile(request), workdir=str(workdir),
                                   compiler_args=args, inline_weights_to_neff=request.inline_weights_to_neff,
                                   has_neuron_device=bool(self.devices), tnx_version=version("torch-neuronx"),
                                   api=api)
        if request.tp_degree > 1:
            if "tp_degree" not in signature_params(fn):
                raise CompileFailed(Status.TOOLCHAIN_MISSING, f"{api}() of the installed neuronx-distributed "
                                    f"{version('neuronx-distributed')} has no tp_degree parameter; "
                                    f"{NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING)
            kwargs["tp_degree"] = request.tp_degree
        return kwargs

    def _warn_once(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)
            print(f"warning: {message}", flush=True)

    def _neff_hook(self, request: CompileRequest, model):
        """The ``generate_neff`` hook of :mod:`~neuron_build.compilers.neuron.hlo_key` when the request asks
        for a graph key or keeps its weights apart (``weights = "external"``: the hook checks and stages them,
        :class:`~neuron_build.compilers.neuron.external_weights.ExternalNeffHook`) and the installed
        torch-neuronx has the split functions; else None, with one warning when a graph key was asked for
        (the fallback is today's path)."""
        external = not request.inline_weights_to_neff
        if not (request.options or {}).get(graph_key.OPTION) and not external:
            return None
        from neuron_build.compilers.neuron import external_weights, hlo_key

        module, missing = hlo_key.split_api()
        if module is None:
            if (request.options or {}).get(graph_key.OPTION):
                self._warn_once(hlo_key.FALLBACK_WARNING.format(what=missing))
            return None
        version = self.executable.version if self.executable else None
        if external:
            return external_weights.ExternalNeffHook(module, request, version, model, Path(request.out_dir))
        return hlo_key.NeffHook(module, request, version)

    def _weights(self, request: CompileRequest, hook, out: Path) -> dict[str, Any]:
        """The manifest's ``weights`` (``external``: ``weights.safetensors`` beside ``model.pt``, a relink
        source; ``inline``) and, when the profile asked for external weights and did not get them,
        ``weights_inline_why``; the weights files are removed from ``out`` then."""
        if request.inline_weights_to_neff:
            return {"weights": "inline"}
        why = getattr(hook, "inline_why", "torch_neuronx.trace did not call generate_neff")
        if request.tp_degree > 1:
            why = "tensor-parallel artifacts keep their weights per rank"
        if why is None:
            from neuron_build.compilers.neuron.external_weights import LOADER
            return {"weights": "external", "loader": LOADER}
        from neuron_build.compilers.neuron.external_weights import unstage
        unstage(out)
        return {"weights": "inline", "weights_inline_why": why}

    def _trace(self, fn, model, example_inputs, kwargs: dict[str, Any], request: CompileRequest, hook,
               monitor: ChildPeakMonitor, work: Path):
        """Run ``fn`` (trace or parallel_model_trace), with the ``generate_neff`` hook installed when there is
        one. Raises GraphHit (the graph index holds this graph: nothing compiled) or CompileFailed."""
        import torch

        tp, workdir = request.tp_degree, work / "neuron"
        try:
            with monitor, torch.no_grad():
                if tp > 1:
                    factory = RankModelFactory(request.root, request.factory, dict(request.kwargs), request.dtype,
                                               request.hf)
                    return fn(factory, example_inputs, **kwargs)
                if hook is not None:
                    with hook.installed():  # the graph key before neuronx-cc: a hit raises GraphHit
                        return fn(model, example_inputs, **kwargs)
                return fn(model, example_inputs, **kwargs)
        except graph_key.GraphHit:
            raise
        except Exception as e:
            if hook is not None and hook.hit:  # trace wrapped the hook's GraphHit: still a hit, nothing compiled
                raise graph_key.GraphHit(hook.hit) from e
            logs = ([workdir / f"_tp{r}" / LOG_NAME for r in range(tp)] if tp > 1 else [workdir / LOG_NAME])
            raise classify_failure(e, logs, work, has_neuron_device=bool(self.devices), tp_degree=tp,
                                   compiler_peak_rss_bytes=monitor.peak) from e

    # -- the compile ---------------------------------------------------------------------------------
    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        """Trace and compile ``model`` for ``example_inputs`` (a tuple of tensors of the bucket's shapes
        and dtypes); write the artifact files into ``request.out_dir``.

        Raises:
            CompileFailed: ``TOOLCHAIN_MISSING`` (see :meth:`preflight`); ``ERROR`` with
                ``"<CODE>: <first diagnostic line>"`` when neuronx-cc reports an error (diagnostics in
                the details); ``TRANSIENT`` (exit 70) when neuronx-cc exits with 70; ``KILLED`` (exit 137)
                when a signal killed neuronx-cc; ``ERROR`` for any other failure of the trace.
        """
        self.preflight(request)
        work = Path(request.work_dir).resolve()
        workdir = work / "neuron"
        workdir.mkdir(parents=True, exist_ok=True)
        out = Path(request.out_dir)
        fn, api = self._trace_fn(request)
        kwargs = self._kwargs(request, workdir)
        shown_args = [_show_arg(a, workdir) for a in kwargs["compiler_args"]]
        print(f"{api}: compiler_workdir={workdir} compiler_args={shown_args} "
              f"{ {k: v for k, v in kwargs.items() if k not in ('compiler_workdir', 'compiler_args')} }", flush=True)
        for w in self.warnings:
            print(f"warning: {w}", flush=True)

        tp = request.tp_degree
        hook = self._neff_hook(request, model) if tp == 1 else None
        t0 = time.monotonic()
        monitor = ChildPeakMonitor()
        enter_stage("compile")  # torch_neuronx.trace: graph capture and neuronx-cc
        traced = self._trace(fn, model, example_inputs, kwargs, request, hook, monitor, work)
        trace_s = time.monotonic() - t0
        self._key_after_trace(request, hook, workdir)

        enter_stage("save")
        ranks = save_model(traced, out, workdir, tp)
        files, logs, neffs, summaries = collect_ranks(ranks, out, api, self.warnings)

        enter_stage("count")
        op_count, source, per_rank, op_details = self._op_count(summaries, ranks, model, example_inputs, work)
        details = self._details(request, fn, api, kwargs, shown_args, hook, summaries, monitor.peak)
        details.update({"files": files, "logs": logs, "neff": neffs, "trace_time_s": round(trace_s, 3)})
        details.update(self._weights(request, hook, out))
        if per_rank is not None:
            details["op_count_per_rank"] = per_rank
        details.update(op_details)
        print(f"traced in {trace_s:.1f} s; op count {op_count} ({source}); "
              f"compiler compile time {details['compiler_compile_time_s']} s; NEFFs {sorted(neffs)}", flush=True)
        return CompileResult(op_count=op_count, op_count_source=source, details=details)

    def _key_after_trace(self, request: CompileRequest, hook, workdir: Path) -> None:
        """The HLO key's fallback: a trace that did not go through ``generate_neff`` (no hook, or an older
        torch-neuronx) is keyed after neuronx-cc ran, from the HLO in the workdir (recorded, never a hit)."""
        if hook is not None and not hook.called:
            self._warn_once("torch_neuronx.trace did not call generate_neff: the HLO graph key is made after "
                            "neuronx-cc runs (today's path), so a graph-neutral edit still compiles")
        if request.tp_degree == 1 and (hook is None or not hook.called):  # keyed after the compile, never a hit
            graph_key.checkpoint(request, lambda: graph_key.hlo_document(workdir / "model"), reuse=False)

    def _details(self, request: CompileRequest, fn, api: str, kwargs: dict[str, Any], shown_args: list[str],
                 hook, summaries: list[LogSummary | None], peak: int) -> dict[str, Any]:
        """The compiler section of the manifest (times in seconds, memory in bytes), without the files."""
        import os

        tp = request.tp_degree
        first = summaries[0]
        times = [s.compile_time_s for s in summaries if s is not None and s.compile_time_s is not None]
        compiler_time = max(times) if times else None
        diagnostics = [d for s in summaries if s is not None for d in (x.to_json() for x in s.diagnostics)]
        log_status = first.status if first is not None else None
        if log_status == Status.ERROR:
            self.warnings.append("neuronx-cc exited with status 0 but its log says ERROR; the exit status wins")
        exe = self.executable
        return {
            "artifact": "model.pt" if tp == 1 else [f"tp_{r}.pt" for r in range(tp)],
            "loader": NEURON_JIT_LOADER if tp == 1 else NEURON_TP_LOADER,
            "trace_api": api,
            "trace_parameters": signature_params(fn),
            "trace_kwargs": {k: v for k, v in kwargs.items() if k not in ("compiler_workdir", "compiler_args")},
            "compiler_args": shown_args,
            "tp_degree": tp,
            "cpu_backend": bool(kwargs.get("cpu_backend", False)),
            "neuron_devices": list(self.devices),
            "hlo_graph_key": ("before neuronx-cc (generate_neff hook)" if hook is not None and hook.called
                              else "after neuronx-cc" if tp == 1 else None),
            "compiler_compile_time_s": compiler_time,
            "compiler_peak_rss_bytes": peak,
            "neuronx_cc_executable": {"path": exe.path if exe else None, "version": exe.version if exe else None},
            "env": graph_env(os.environ),
            "warnings": list(self.warnings),
            "toolchain": {"neuronx-cc --version": exe.version if exe else None},
            "metrics": {"compiler_status": log_status, "compiler_compile_time_s": compiler_time,
                        "compiler_peak_rss_bytes": peak, "diagnostics": diagnostics,
                        "instruction_count": first.instruction_count if first is not None else None},
        }

    def _op_count(self, summaries, ranks, model, example_inputs, work: Path):
        """(op count, source, per-rank counts or None, extra details). Rank 0's count for TP models
        (every rank runs the same program on its shard [guess]); the log first, then the HLO in the
        workdir, then torch_neuronx.analyze."""
        from neuron_build.compilers.neuron.hlo import count_hlo_instructions, find_hlo

        per_rank: list[int | None] = [s.op_count if s is not None else None for s in summaries]
        if per_rank[0] is not None:
            return per_rank[0], SOURCE_LOG, (per_rank if len(ranks) > 1 else None), {}
        hlo_counts = []
        for _stem, rank_dir in ranks:
            hlo = find_hlo(rank_dir)
            hlo_counts.append(count_hlo_instructions(hlo) if hlo is not None else None)
        if hlo_counts[0] is not None:
            return hlo_counts[0], SOURCE_HLO, (hlo_counts if len(ranks) > 1 else None), {}
        try:
            count, report = analyze_op_count(model, example_inputs, work / "neuron-analyze")
        except Exception as e:
            msg = f"torch_neuronx.analyze failed: {type(e).__name__}: {first_line(e)}"
            self.warnings.append(msg)
            return None, None, None, {"op_count_error": msg}
        return count, SOURCE_ANALYZE, None, {"analyze": report}


# -- helpers ------------------------------------------------------------------------------------------
def _show_arg(arg: str, workdir: Path) -> str:
    """Compiler args as recorded in the manifest: the staging path replaced by ``<workdir>``."""
    return arg.replace(str(workdir), "<workdir>")


def _profile(request: CompileRequest) -> str:
    return request.target.rsplit("/", 1)[-1]


__all__ = ["ADDED_IN", "EXIT_KILLED", "EXIT_TRANSIENT", "LOG_NAME", "SOURCE_ANALYZE", "SOURCE_HLO", "SOURCE_LOG",
           "ChildPeakMonitor", "NeuronCompiler", "RankModelFactory", "analyze_op_count", "classify_failure",
           "graph_env", "log_digest", "plan_trace_kwargs", "signature_params"]
