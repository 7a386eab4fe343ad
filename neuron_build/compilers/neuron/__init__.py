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

import inspect
import re
import shutil
import signal
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
from neuron_build.compilers.neuron.neuronx_log import LogSummary, failure_reason, parse_log
from neuron_build.project.toolchain import (
    NEURON_INDEX_URL,
    NEURON_INSTALL_HINT,
    CompilerExecutable,
    compiler_executable,
    neuron_devices,
    neuron_status,
    version,
)
from neuron_build.status import Status

#: The compiler log's name in the workdir (neuronx-cc's default name) [doc].
LOG_NAME = "log-neuron-cc.txt"
#: op_count_source values, in the order they are tried.
SOURCE_LOG = "neuronx-cc log"
SOURCE_HLO = "HLO instruction count"
SOURCE_ANALYZE = "torch_neuronx.analyze operator counts"
#: ``RuntimeError("neuronx-cc failed with 1")`` [seen].
_FAILED_WITH = re.compile(r"neuronx-cc failed with (-?\d+)")
EXIT_TRANSIENT = 70      # [seen]
EXIT_KILLED = 137        # the worker's own status for a compiler killed by SIGKILL (128 + 9, shell style)
#: What ``trace`` needs, per parameter, and the SDK release that added it [doc].
ADDED_IN = {"inline_weights_to_neff": "2.16", "cpu_backend": "2.21"}


def _install_newer(what: str) -> str:
    return (f"install a torch-neuronx whose trace() has {what} from AWS's Neuron package index "
            f"({NEURON_INDEX_URL}; see \"On a Neuron host\" in README.md)")


def plan_trace_kwargs(params: Iterable[str], *, profile: str, workdir: str, compiler_args: list[str],
                      inline_weights_to_neff: bool, has_neuron_device: bool, tnx_version: str | None,
                      api: str = "torch_neuronx.trace") -> dict[str, Any]:
    """The keyword arguments to pass to ``trace`` (or ``parallel_model_trace``), given the parameter
    names its installed signature has.

    Args:
        params: the parameter names of the installed function (``inspect.signature``), ``**kwargs``
            excluded: the real trace only warns about unknown names [seen], so they are never passed.
        profile: the profile's name, for messages.
        workdir: the absolute compiler workdir.
        compiler_args: the full compiler args (profile args + ``--target`` + ``--logfile``).
        inline_weights_to_neff: the profile's option.
        has_neuron_device: this host has a Neuron device; without one ``cpu_backend=True`` is needed.
        tnx_version: the installed torch-neuronx version, for messages.
        api: the function's name, for messages; ``cpu_backend`` is only planned for torch_neuronx.trace.

    Returns:
        ``{"compiler_workdir": ..., "compiler_args": [...], "inline_weights_to_neff": ..., "cpu_backend": True}``,
        each only when the signature has it and it is needed.

    Raises:
        CompileFailed: status ``TOOLCHAIN_MISSING`` (exit 3) when the profile or the host needs a
            parameter the installed version lacks: ``inline_weights_to_neff = false`` before 2.16, or
            ``cpu_backend`` (no Neuron device) before 2.21. TOOLCHAIN_MISSING rather than ERROR: the
            target is fine, this host's toolchain cannot build it; a newer toolchain (or a Neuron host)
            can, and the next build retries it.
    """
    names = set(params)
    have = f"the installed torch-neuronx {tnx_version or '(unknown version)'}"
    for needed in ("compiler_workdir", "compiler_args"):
        if needed not in names:
            raise CompileFailed(Status.TOOLCHAIN_MISSING, f"{api}() of {have} has no {needed} parameter, which "
                                f"neuron-build needs; {_install_newer(needed)}", EXIT_TOOLCHAIN_MISSING)
    kwargs: dict[str, Any] = {"compiler_workdir": workdir, "compiler_args": list(compiler_args)}
    if "inline_weights_to_neff" in names:
        kwargs["inline_weights_to_neff"] = bool(inline_weights_to_neff)
    elif not inline_weights_to_neff:
        raise CompileFailed(
            Status.TOOLCHAIN_MISSING,
            f"profile {profile} sets inline_weights_to_neff = false, but {api}() of {have} has no "
            f"inline_weights_to_neff parameter (added in SDK {ADDED_IN['inline_weights_to_neff']}); "
            f"{_install_newer('it')}, or set inline_weights_to_neff = true", EXIT_TOOLCHAIN_MISSING)
    if api == "torch_neuronx.trace" and not has_neuron_device:
        if "cpu_backend" not in names:
            raise CompileFailed(
                Status.TOOLCHAIN_MISSING,
                f"this host has no Neuron device (/dev/neuron* not found) and {api}() of {have} has no "
                f"cpu_backend parameter (added in SDK {ADDED_IN['cpu_backend']}) to compile without one; "
                f"compile on a Trainium/Inferentia host or {_install_newer('cpu_backend')}",
                EXIT_TOOLCHAIN_MISSING)
        kwargs["cpu_backend"] = True
    return kwargs


def signature_params(fn: Any) -> list[str]:
    """Parameter names of ``fn`` that can be passed by keyword (``*args``/``**kwargs`` excluded)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def graph_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change a Neuron compile (as the key counts them), sorted."""
    from neuron_build.project.keys import key_env
    return key_env("neuron", dict(environ))


def log_digest(summary: LogSummary) -> dict[str, Any]:
    """What the manifest keeps of a parsed compiler log (times in seconds)."""
    d = summary.to_json()
    keep = ("status", "op_count", "compile_time_s", "instruction_count", "pass_times", "diagnostics",
            "internal_errors", "cache_events", "unparsed", "lines", "replaced_bytes")
    return {k: d[k] for k in keep}


class ChildPeakMonitor:
    """Samples the peak resident memory of this process's children (neuronx-cc and its helpers) while a
    trace runs: every ``interval_s`` seconds, the sum over live children of their ``VmHWM`` (the kernel's
    per-process high-water mark of resident memory, /proc/<pid>/status, Linux). Bytes in ``peak``.

    ``getrusage(RUSAGE_CHILDREN)`` is not used: a forked child's maximum counts the parent's pages from
    before its exec, so it reports the worker's size, not the compiler's.
    """

    def __init__(self, interval_s: float = 0.1):
        import threading
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="child-peak-rss", daemon=True)

    def __enter__(self) -> ChildPeakMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> int:
        """One sample: the summed high-water marks of the live children, in bytes."""
        import psutil
        total = 0
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return 0
        for child in children:
            try:
                with open(f"/proc/{child.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            total += int(line.split()[1]) * 1024  # kB
                            break
            except (OSError, ValueError):
                continue
        self.peak = max(self.peak, total)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)


@dataclass(frozen=True)
class RankModelFactory:
    """``func`` for ``parallel_model_trace``: builds the model from its factory and returns
    ``(model, {})`` (no input/output aliases). Picklable, for ranks that run in spawned processes."""

    root: str
    factory: str | None
    kwargs: dict
    dtype: str
    hf: dict | None = None

    def __call__(self):
        from neuron_build.examples import build_model
        return build_model(self.root, self.factory, self.kwargs, self.dtype, hf=self.hf), {}


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
                                f"{_first_line(e)}); {NEURON_INSTALL_HINT}.", EXIT_TOOLCHAIN_MISSING) from e
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
                                    f"({type(e).__name__}: {_first_line(e)}); {NEURON_INSTALL_HINT}.",
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

    def _neff_hook(self, request: CompileRequest):
        """The ``generate_neff`` hook of :mod:`~neuron_build.compilers.neuron.hlo_key` when the request asks
        for a graph key and the installed torch-neuronx has the split functions; else None, with one
        warning when a graph key was asked for (the fallback is today's path)."""
        if not (request.options or {}).get(graph_key.OPTION):
            return None
        from neuron_build.compilers.neuron import hlo_key

        module, missing = hlo_key.split_api()
        if module is None:
            self._warn_once(hlo_key.FALLBACK_WARNING.format(what=missing))
            return None
        return hlo_key.NeffHook(module, request, self.executable.version if self.executable else None)

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

    # -- the compile -----------------------------------------------------------------------------
    def compile(self, model, example_inputs, request: CompileRequest) -> CompileResult:
        """Trace and compile ``model`` for ``example_inputs`` (a tuple of tensors of the bucket's shapes
        and dtypes); write the artifact files into ``request.out_dir``.

        Raises:
            CompileFailed: ``TOOLCHAIN_MISSING`` (see :meth:`preflight`); ``ERROR`` with
                ``"<CODE>: <first diagnostic line>"`` when neuronx-cc reports an error (diagnostics in
                the details); ``TRANSIENT`` (exit 70) when neuronx-cc exits with 70; ``KILLED`` (exit 137)
                when a signal killed neuronx-cc; ``ERROR`` for any other failure of the trace.
        """
        import os

        import torch

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
        hook = self._neff_hook(request) if tp == 1 else None
        t0 = time.monotonic()
        monitor = ChildPeakMonitor()
        enter_stage("compile")  # torch_neuronx.trace: graph capture and neuronx-cc
        traced = self._trace(fn, model, example_inputs, kwargs, request, hook, monitor, work)
        trace_s = time.monotonic() - t0
        if hook is not None and not hook.called:
            self._warn_once("torch_neuronx.trace did not call generate_neff: the HLO graph key is made after "
                            "neuronx-cc runs (today's path), so a graph-neutral edit still compiles")
        if tp == 1 and (hook is None or not hook.called):  # today's path: keyed after the compile, never a hit
            graph_key.checkpoint(request, lambda: graph_key.hlo_document(workdir / "model"), reuse=False)

        files: dict[str, dict[str, str | None]] = {}
        enter_stage("save")
        if tp > 1:
            from neuronx_distributed.trace import parallel_model_save
            parallel_model_save(traced, str(out))
            ranks = [(f"tp_{r}", workdir / f"_tp{r}") for r in range(tp)]
        else:
            with warnings.catch_warnings():  # torch 2.13 marks jit.save deprecated; Neuron documents it [doc]
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.jit.save(traced, str(out / "model.pt"))
            ranks = [("model", workdir)]
        logs: dict[str, dict[str, Any]] = {}
        neffs: dict[str, dict[str, Any]] = {}
        summaries: list[LogSummary | None] = []
        for stem, rank_dir in ranks:
            pt = f"{stem}.pt"
            if not (out / pt).is_file():
                raise CompileFailed(Status.ERROR, f"{api} returned but {pt} was not written")
            neff_name = f"{stem}.neff"
            neffs[neff_name] = _copy_neff(rank_dir / "graph.neff", out / neff_name)
            log_name = "compile.log" if stem == "model" else f"{stem}.compile.log"
            log_src = _find_log(rank_dir, tp)
            summary = None
            if log_src is not None:
                shutil.copyfile(log_src, out / log_name)
                summary = parse_log((out / log_name).read_bytes())
                logs[log_name] = log_digest(summary)
            else:
                self.warnings.append(f"no compiler log found in {rank_dir} (looked for {LOG_NAME})")
            summaries.append(summary)
            cmd_name = "command.txt" if stem == "model" else f"{stem}.command.txt"
            if (rank_dir / "command.txt").is_file():
                shutil.copyfile(rank_dir / "command.txt", out / cmd_name)
            files[stem] = {"model": pt, "neff": neff_name, "log": log_name if log_src else None,
                           "command": cmd_name if (out / cmd_name).exists() else None}

        enter_stage("count")
        op_count, source, per_rank, op_details = self._op_count(summaries, ranks, model, example_inputs, work)
        first = summaries[0]
        times = [s.compile_time_s for s in summaries if s is not None and s.compile_time_s is not None]
        compiler_time = max(times) if times else None
        diagnostics = [d for s in summaries if s is not None for d in (x.to_json() for x in s.diagnostics)]
        log_status = first.status if first is not None else None
        if log_status == Status.ERROR:
            self.warnings.append("neuronx-cc exited with status 0 but its log says ERROR; the exit status wins")
        peak = monitor.peak
        exe = self.executable
        details: dict[str, Any] = {
            "artifact": "model.pt" if tp == 1 else [f"tp_{r}.pt" for r in range(tp)],
            "loader": ("import torch_neuronx; torch.jit.load('model.pt')" if tp == 1 else
                       "import torch_neuronx; neuronx_distributed.trace.parallel_model_load(<artifact folder>)"),
            "trace_api": api,
            "trace_parameters": signature_params(fn),
            "trace_kwargs": {k: v for k, v in kwargs.items() if k not in ("compiler_workdir", "compiler_args")},
            "compiler_args": shown_args,
            "tp_degree": tp,
            "cpu_backend": bool(kwargs.get("cpu_backend", False)),
            "neuron_devices": list(self.devices),
            "files": files,
            "logs": logs,
            "neff": neffs,
            "hlo_graph_key": ("before neuronx-cc (generate_neff hook)" if hook is not None and hook.called
                              else "after neuronx-cc" if tp == 1 else None),
            "trace_time_s": round(trace_s, 3),
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
        if per_rank is not None:
            details["op_count_per_rank"] = per_rank
        details.update(op_details)
        print(f"traced in {trace_s:.1f} s; op count {op_count} ({source}); "
              f"compiler compile time {compiler_time} s; NEFFs {sorted(neffs)}", flush=True)
        return CompileResult(op_count=op_count, op_count_source=source, details=details)

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
            msg = f"torch_neuronx.analyze failed: {type(e).__name__}: {_first_line(e)}"
            self.warnings.append(msg)
            return None, None, None, {"op_count_error": msg}
        return count, SOURCE_ANALYZE, None, {"analyze": report}


def analyze_op_count(model, example_inputs, workdir: Path) -> tuple[int, dict[str, Any]]:
    """Op count from ``torch_neuronx.analyze`` [doc]: the sum of ``supported_operators`` counts plus one
    per ``unsupported_operators`` entry. Returns (count, report for the manifest).

    Raises:
        Exception: whatever analyze raises; ValueError when its result has no operator counts.
    """
    import torch_neuronx

    kwargs: dict[str, Any] = {}
    if "compiler_workdir" in signature_params(torch_neuronx.analyze):
        workdir.mkdir(parents=True, exist_ok=True)
        kwargs["compiler_workdir"] = str(workdir)
    report = torch_neuronx.analyze(model, example_inputs, **kwargs)
    supported = report.get("supported_operators") if isinstance(report, dict) else None
    if not isinstance(supported, dict):
        raise ValueError("torch_neuronx.analyze returned no supported_operators counts")
    unsupported = report.get("unsupported_operators") or []
    count = sum(int(v) for v in supported.values()) + len(unsupported)
    kinds = sorted({u.get("kind", "?") for u in unsupported if isinstance(u, dict)})
    return count, {"supported_operators": dict(sorted(supported.items())), "unsupported_operators": kinds,
                   "support_percentage": report.get("support_percentage")}


def classify_failure(exc: BaseException, logs: list[Path], work: Path, *, has_neuron_device: bool,
                     tp_degree: int = 1, compiler_peak_rss_bytes: int | None = None) -> CompileFailed:
    """Turn an exception from ``trace`` into a :class:`CompileFailed` with a manifest status.

    ``logs`` are the candidate compiler logs (the last one that exists is read). Status 70 -> TRANSIENT
    (exit 70, so the build retries it); a negative status -> KILLED (exit 137; the build adds the peak
    memory); any other compiler status -> ERROR with ``"<CODE>: <first diagnostic line>"`` when the log
    has one; anything else -> ERROR with the exception's first line. Details carry the compiler status,
    the parsed log (diagnostics with code, message and line), the compiler's peak memory and the log's
    path relative to the work folder (``compiler_log``) so the build keeps it with the failure.
    ``compiler_peak_rss_bytes`` is what :class:`ChildPeakMonitor` saw (bytes), recorded as given.
    """
    text = str(exc)
    m = _FAILED_WITH.search(text)
    log_path = next((p for p in reversed(logs) if p.is_file()), None)
    summary = parse_log(log_path.read_bytes()) if log_path is not None else None
    details: dict[str, Any] = {"exception": f"{type(exc).__name__}: {_first_line(exc)}",
                               "compiler_peak_rss_bytes": compiler_peak_rss_bytes}
    if summary is not None:
        details["log"] = log_digest(summary)
        details["diagnostics"] = [d.to_json() for d in summary.diagnostics]
        try:
            details["compiler_log"] = log_path.relative_to(work).as_posix()
        except ValueError:
            details["compiler_log"] = str(log_path)
    found = failure_reason(summary) if summary is not None else None
    if m is None:
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        if not has_neuron_device and tp_degree > 1:
            reason += (" (this host has no Neuron device, /dev/neuron* not found; tensor-parallel tracing with "
                       "neuronx-distributed needs one)")
        return CompileFailed(Status.ERROR, reason[:500], 1, details)
    code = int(m.group(1))
    details["compiler_exit_code"] = code
    if code == EXIT_TRANSIENT:
        reason = "neuronx-cc exited with status 70 (a transient tool failure)" + (f": {found}" if found else "")
        return CompileFailed(Status.TRANSIENT, reason[:500], EXIT_TRANSIENT, details)
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        reason = f"neuronx-cc was killed by {sig}"
        if sig == "SIGKILL":
            reason += " (usually the kernel's out-of-memory killer)"
        return CompileFailed(Status.KILLED, reason, EXIT_KILLED if sig == "SIGKILL" else 128 - code, details)
    if found:
        reason = found
    else:
        last = _last_log_line(log_path)
        reason = f"neuronx-cc failed with status {code}" + (f": {last}" if last else " (no compiler log)")
    return CompileFailed(Status.ERROR, reason[:500], 1, details)


# -- helpers ------------------------------------------------------------------------------------------
def _copy_neff(src: Path, dst: Path) -> dict[str, Any]:
    from neuron_build.compilers.neuron.neff import NeffError, read_neff_header

    if not src.is_file():
        where = f"{src.parent.name}/{src.name}" if src.parent.name.startswith("_tp") else src.name
        raise CompileFailed(Status.ERROR, f"the compile succeeded but left no {where} in the compiler workdir")
    shutil.copyfile(src, dst)
    try:
        return read_neff_header(dst).to_json()
    except NeffError as e:
        raise CompileFailed(Status.ERROR, f"the compiled {dst.name} is not a valid NEFF: {e}") from e


def _find_log(rank_dir: Path, tp_degree: int = 1) -> Path | None:
    """The compiler log of one compile: ``<rank dir>/log-neuron-cc.txt``; for TP degree 1 also the
    worker's cwd, where neuronx-cc writes it when ``--logfile`` did not take effect [doc: default name]."""
    cands = [rank_dir / LOG_NAME] + ([Path.cwd() / LOG_NAME] if tp_degree == 1 else [])
    return next((c for c in cands if c.is_file()), None)


def _show_arg(arg: str, workdir: Path) -> str:
    """Compiler args as recorded in the manifest: the staging path replaced by ``<workdir>``."""
    return arg.replace(str(workdir), "<workdir>")


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else ""


def _last_line_of(data: bytes) -> str:
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _last_log_line(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return _last_line_of(path.read_bytes())
    except OSError:
        return ""


def _profile(request: CompileRequest) -> str:
    return request.target.rsplit("/", 1)[-1]


__all__ = ["ADDED_IN", "EXIT_KILLED", "EXIT_TRANSIENT", "LOG_NAME", "SOURCE_ANALYZE", "SOURCE_HLO", "SOURCE_LOG",
           "ChildPeakMonitor", "NeuronCompiler", "RankModelFactory", "analyze_op_count", "classify_failure",
           "graph_env", "log_digest", "plan_trace_kwargs", "signature_params"]
