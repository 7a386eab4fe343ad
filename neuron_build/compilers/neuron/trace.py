"""What the neuron backend hands ``torch_neuronx.trace`` (or ``parallel_model_trace``), and what it watches
while the trace runs.

- :func:`plan_trace_kwargs`: the keyword arguments the installed signature can take (probed, never assumed:
  unknown keyword arguments only produce a warning [seen]); a parameter the profile or host needs and the
  installed version lacks is ``TOOLCHAIN_MISSING``.
- :class:`ChildPeakMonitor`: the compiler's peak resident memory while the trace runs.
- :class:`RankModelFactory`: the picklable ``func`` ``parallel_model_trace`` calls once per rank.

Facts and their tags: :mod:`neuron_build.compilers.neuron` (the module docstring).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from neuron_build.compilers.base import EXIT_TOOLCHAIN_MISSING, CompileFailed
from neuron_build.project.toolchain import NEURON_INDEX_URL
from neuron_build.status import Status

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


__all__ = ["ADDED_IN", "ChildPeakMonitor", "RankModelFactory", "plan_trace_kwargs", "signature_params"]
