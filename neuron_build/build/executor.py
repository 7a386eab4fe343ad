"""The seam between the builder and whatever runs the compile of one target.

An :class:`Executor` takes a :class:`~neuron_build.compilers.base.CompileRequest` and runs the worker
(``python -m neuron_build.worker``, or the same code elsewhere) for it; it hands back what the worker
reported as data (:class:`CompileRun`) and the artifact's files in the request's ``out_dir``. It never
classifies, records or publishes anything: that is the builder's job (:mod:`neuron_build.build.attempt`,
:mod:`neuron_build.build.builder`).

The implementation is :class:`neuron_build.build.local.LocalExecutor` (a supervised subprocess on this
host). The Dask executor (:mod:`neuron_build.build.fleet.dask_executor`) sits one level up, because its workers
publish straight into the shared store: it sends the whole build of a target (key lock, compile, publish) to
a Dask worker, where a :class:`~neuron_build.build.builder.Builder` runs it through a ``LocalExecutor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from neuron_build.compilers.base import CompileRequest

if TYPE_CHECKING:
    from neuron_build.project.keys import KeyInfo
    from neuron_build.project.matrix import Target
    from neuron_build.workspace import Workspace

#: The worker's stdout/stderr, as stored in an artifact (``compile.log`` is the compiler's own log, e.g.
#: neuronx-cc's) and as the local executor writes it in the attempt's work folder.
WORKER_LOG = "worker.log"


@dataclass(frozen=True)
class CompileRun:
    """What one run of the worker reported, as data.

    Attributes:
        exit_code: the worker's exit status; negative for a signal (``-9``: SIGKILL); None when no worker
            ran (or its status could not be collected).
        wall_s: wall time of the run, seconds.
        peak_rss_bytes: peak resident memory of the worker's process tree, bytes (0 when unknown).
        timed_out: the executor stopped the run after its timeout.
        log: the worker's stdout and stderr, bytes.
        result: the content of the worker's ``result.json`` (op count, its source, backend details), or
            None when it wrote none.
        error: the content of the worker's ``error.json`` (status, reason, details), or None.
        compiler_log: the compiler's own log named by ``error["details"]["compiler_log"]`` (bytes), or None
            when the worker named none or it could not be read.
        memory_limit_bytes: the memory bound the executor held the worker's process tree to, bytes (None:
            unbounded); ``memory_limit_of`` names whose bound it is (e.g. a Dask worker's ``--memory-limit``).
        out_of_memory: the tree's resident memory passed ``memory_limit_bytes``: the executor killed it
            (or it ended above the bound between two samples); ``peak_rss_bytes`` is above the bound.
    """

    exit_code: int | None
    wall_s: float
    peak_rss_bytes: int
    timed_out: bool
    log: bytes
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    compiler_log: bytes | None = None
    memory_limit_bytes: int | None = None
    memory_limit_of: str = ""
    out_of_memory: bool = False


#: The run of a compile that never started (no room to prepare it).
NOT_RUN = CompileRun(exit_code=None, wall_s=0.0, peak_rss_bytes=0, timed_out=False, log=b"")


class Executor(Protocol):
    """Runs the compile of one target: request in, :class:`CompileRun` and the artifact's files out."""

    def run(self, request: CompileRequest, work_dir: Path, log: Any) -> CompileRun:
        """Run the worker for ``request`` and wait for it.

        Args:
            request: the compile; ``request.out_dir`` is the (empty) folder that holds the artifact's
                files when ``run`` returns, ``request.work_dir`` the compiler's work folder. An executor
                whose worker runs elsewhere gives the worker its own folders and copies the artifact's files
                back into ``out_dir``; everything else comes back in the :class:`CompileRun`.
            work_dir: this attempt's folder on the builder's side (the executor's files: request, log).
            log: a structlog logger bound to the target; progress events (``still compiling``) go to it.

        Returns:
            what the worker reported. A failed, killed or timed-out compile is a normal return, not an
            exception.

        Raises:
            OSError: the executor could not run the worker (a full disk included: the builder turns
                ``ENOSPC`` into a failure of the target).
        """
        ...


def compile_request(ws: Workspace, target: Target, ki: KeyInfo, out_dir: Path | str, work_dir: Path | str
                    ) -> CompileRequest:
    """The worker request for ``target`` of ``ws`` (its key ``ki``): the artifact's files go to ``out_dir``, the
    compiler works in ``work_dir`` (both as the worker sees them)."""
    cfg = ws.project.config
    m, prof = cfg.models[target.model], cfg.profiles[target.profile]
    return CompileRequest(
        target=target.id, key=ki.key, root=str(ws.project.root), factory=m.factory, kwargs=dict(m.kwargs),
        dtype=target.dtype, inputs=ki.details["inputs"]["inputs"], backend=ws.keys.backend,
        hardware_target=ws.keys.hardware_target, compiler_args=list(prof.compiler_args),
        inline_weights_to_neff=prof.inline_weights_to_neff, tp_degree=prof.tp_degree,
        out_dir=str(out_dir), work_dir=str(work_dir), seed=int(ki.key[:8], 16), hf=m.hf_spec(),
        never_read=[str(Path(p).resolve()) for p in ws.keys.exclude],
        options=({"task": m.task, "graph": target.graph, "batch": dict(target.bucket)["batch"],
                  "seq": dict(target.bucket).get("seq", 1), "max_seq_len": m.max_seq_len,
                  "neuron_config": ki.details["inputs"].get("neuron_config")}
                 if target.graph else {}))


__all__ = ["NOT_RUN", "WORKER_LOG", "CompileRun", "Executor", "compile_request"]
