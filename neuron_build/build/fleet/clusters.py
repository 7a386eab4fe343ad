"""Where the Dask executor's workers come from: a running scheduler (``[build] scheduler``), or Slurm jobs
made through dask-jobqueue's ``SLURMCluster`` (``[dask] cluster = "slurm"``).

With Slurm the client starts the scheduler in its own process (``SLURMCluster``) and Slurm runs one ``sbatch``
job per worker (``cores``, ``memory``, ``walltime``, ``queue``, ``job_extra_directives``,
``job_script_prologue`` from ``[dask]``). Each worker:

* is started with ``--lifetime`` = walltime - margin and ``--lifetime-stagger`` = margin / 4, so it leaves
  before Slurm's walltime kills it (dask-jobqueue's advice [doc] ``clusters-advanced-tips-and-tricks.rst``:
  without it the walltime kill counts against the tasks, ``KilledWorker``);
* advertises its memory as the ``memory_gb`` resource (GB = 1e9 bytes; ``memory / processes``), so the
  executor's memory packing applies, and runs ``cores / processes`` threads, one compile each.

The number of jobs follows the predicted work, not Dask's own occupancy guess (every compile has one task
prefix, so Dask sees them all as equally long): :class:`PredictedAdaptive` asks for
:func:`scale_target` jobs, between ``minimum_jobs`` and ``maximum_jobs``, and scales down only jobs whose
workers run nothing (Dask's default may close a worker in the middle of a long compile: distributed#7481).
A Slurm job that dies (``scancel``, a node failure, a Spot reclaim, ``--lifetime``) is a lost worker, not a
failed compile: the scheduler gives its task to another worker, and ``SLURMCluster`` submits a job in its
place once Dask's ``distributed.deploy.lost-worker-timeout`` (15 s) has passed (measured with distributed
2026.8 and dask-jobqueue 0.9 on the test's one-node Slurm).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.errors import UserError
from neuron_build.project.config_dask import DaskSettings

if TYPE_CHECKING:
    from neuron_build.workspace import Workspace

#: Seconds assumed for a compile nothing predicts (no recorded compile of its model and bucket).
DEFAULT_COMPILE_S = 600.0
#: The prefix of every compile task's key (see :class:`~neuron_build.build.fleet.dask_executor.DaskBuild`).
TASK_PREFIX = "neuron-build-"
#: The task states that are work still to do.
_PENDING = frozenset({"released", "waiting", "no-worker", "queued", "processing"})


def target_of_task(key: Any) -> str | None:
    """The target id in a compile task's key (``neuron-build-<target id>-<key[:12]>-<build id>``), else None."""
    if not isinstance(key, str) or not key.startswith(TASK_PREFIX):
        return None
    parts = key[len(TASK_PREFIX):].rsplit("-", 2)
    return parts[0] if len(parts) == 3 else None


def scale_target(pending: int, work_s: float, slots_per_job: int, target_duration_s: float, minimum: int,
                 maximum: int) -> int:
    """Slurm jobs to ask for: enough that the predicted work (``work_s``, compile seconds summed over the
    ``pending`` compiles) takes about ``target_duration_s`` on ``slots_per_job`` compiles per job, never more
    jobs than the pending compiles can keep busy, and within [``minimum``, ``maximum``].

    >>> scale_target(10, 6000.0, 1, 1800.0, 0, 8)   # 6000 s of work in 30 min on 1 slot a job: 4 jobs
    4
    >>> scale_target(2, 36000.0, 1, 1800.0, 0, 8)   # long compiles, but only 2 of them: 2 jobs
    2
    >>> scale_target(0, 0.0, 4, 1800.0, 1, 8)       # nothing left: the minimum
    1
    """
    if pending <= 0:
        return minimum
    by_work = math.ceil(work_s / (max(slots_per_job, 1) * target_duration_s)) if work_s > 0 else 1
    by_count = math.ceil(pending / max(slots_per_job, 1))
    return max(minimum, min(maximum, max(1, min(by_work, by_count))))


def _adaptive_base() -> type:
    from distributed.deploy.adaptive import Adaptive
    return Adaptive


def make_adaptive(settings: DaskSettings, predict: Callable[[str], float | None],
                  waiting: Callable[[], Iterable[str]] | None = None) -> type:
    """The ``Adaptive`` class for ``SLURMCluster.adapt(Adaptive=...)``: see :class:`PredictedAdaptive`.
    ``waiting()``: the target ids the client still has to build (its queue, submitted or not), if any."""
    base = _adaptive_base()

    class PredictedAdaptive(base):  # type: ignore[misc, valid-type]
        """Scales a dask-jobqueue cluster to :func:`scale_target` jobs from the predicted work of the compiles
        left (``predict(target id)`` -> seconds, None: :data:`DEFAULT_COMPILE_S`): the compile tasks the
        scheduler holds and the targets the client still holds (``waiting``: the client releases a task only
        to a worker that is there, so from zero workers the scheduler alone would never see work and no job
        would ever be submitted), and closes only workers that run nothing."""

        def work(self) -> tuple[int, float]:
            """(pending compiles, their predicted seconds): the scheduler's (same process, same loop) and the
            client's queue."""
            tids = set(waiting() if waiting is not None else ())
            for key, ts in list(self.cluster.scheduler.tasks.items()):
                tid = target_of_task(key)
                if tid is not None and ts.state in _PENDING:
                    tids.add(tid)
            return len(tids), sum(predict(tid) or DEFAULT_COMPILE_S for tid in tids)

        async def target(self) -> int:
            n, total = self.work()
            slots = max(settings.cores // settings.processes, 1) * settings.processes
            jobs = scale_target(n, total, slots, settings.target_duration_s, settings.minimum_jobs,
                                settings.maximum_jobs)
            return jobs * settings.processes  # Adaptive counts workers; a job holds ``processes`` of them

        async def workers_to_close(self, target: int) -> list:
            busy = {ws.name for ws in self.cluster.scheduler.workers.values() if ws.processing}
            names = await super().workers_to_close(target)
            return [n for n in names if n not in busy]

    return PredictedAdaptive


def worker_args(settings: DaskSettings) -> list[str]:
    """The ``dask worker`` arguments of a Slurm job's workers: ``--lifetime`` below the walltime, its
    stagger, and the ``memory_gb`` resource (each worker's share of the job's memory, GB = 1e9 bytes)."""
    from neuron_build.build.fleet.dask_executor import MEMORY_RESOURCE

    gb = settings.memory_bytes / settings.processes / 1e9
    return ["--lifetime", f"{settings.lifetime_s}s", "--lifetime-stagger", f"{max(settings.margin_s // 4, 1)}s",
            "--resources", f"{MEMORY_RESOURCE}={gb:.3f}"]


def check_job_script(script: str, config_file: Any) -> None:
    """Ask Slurm whether it would run the worker job ``script`` (``sbatch --test-only``: nothing is queued).

    Raises:
        UserError: Slurm refuses it (an unknown partition or account, more memory or CPUs than any node has,
            a bad directive): one line with sbatch's reason and the ``[dask]`` keys to fix.
    """
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="neuron-build-job-") as f:
        f.write(script)
        f.flush()
        try:
            r = subprocess.run(["sbatch", "--test-only", f.name], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UserError(f"{config_file}: [dask] cluster = \"slurm\": cannot run sbatch ({e}); run the build on a "
                            f"Slurm submit host") from None
    if r.returncode != 0:
        why = "; ".join(ln.strip() for ln in r.stderr.splitlines() if ln.strip()) or f"exit {r.returncode}"
        raise UserError(f"{config_file}: [dask] cluster = \"slurm\": Slurm refuses the worker job ({why[:300]}); fix "
                        f"[dask] queue, account, cores, memory, walltime or job_extra_directives")


def slurm_cluster(settings: DaskSettings, root: Path, predict: Callable[[str], float | None],
                  config_file: Any = "buckets.toml", waiting: Callable[[], Iterable[str]] | None = None) -> Any:
    """A started, adaptive ``dask_jobqueue.SLURMCluster`` from ``[dask]`` (``root``: the config's folder,
    against which ``log_directory`` resolves; ``config_file``: named in errors; ``waiting``: the client's
    queue, see :func:`make_adaptive`), whose worker job Slurm accepts (:func:`check_job_script`).

    Raises:
        UserError: dask-jobqueue is not installed, ``sbatch`` is not on PATH, the scheduler cannot start,
            or Slurm refuses the worker job; one line with the fix.
    """
    import shutil

    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise UserError(f"{config_file}: [dask] cluster = \"slurm\" needs dask-jobqueue; install it with "
                        "pip install 'neuron-build[slurm]' (or pip install dask-jobqueue)") from None
    if shutil.which("sbatch") is None:
        raise UserError(f"{config_file}: [dask] cluster = \"slurm\" but sbatch is not on PATH; run the build on a "
                        "Slurm submit host (or set [dask] cluster = \"scheduler\")")
    host = settings.scheduler_host
    kw: dict[str, Any] = {
        "cores": settings.cores, "processes": settings.processes, "memory": settings.memory,
        "walltime": settings.walltime, "queue": settings.queue, "account": settings.account,
        "job_name": "neuron-build", "python": sys.executable,
        "job_extra_directives": list(settings.job_extra_directives),
        "job_script_prologue": list(settings.job_script_prologue),
        "worker_extra_args": worker_args(settings),
        "scheduler_options": {"dashboard_address": f"{host or ''}:0", **({"host": host} if host else {})},
    }
    if settings.interface:
        kw["interface"] = settings.interface
    if settings.log_directory:
        kw["log_directory"] = str((root / settings.log_directory).resolve())
    try:
        cluster = SLURMCluster(**kw)
    except Exception as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{config_file}: [dask] cluster = \"slurm\": could not start the Dask scheduler for Slurm "
                        f"({why[:200]}); check [dask] scheduler_host and interface") from None
    try:
        check_job_script(cluster.job_script(), config_file)
    except BaseException:
        cluster.close()
        raise
    cluster.adapt(minimum_jobs=settings.minimum_jobs, maximum_jobs=settings.maximum_jobs,
                  Adaptive=make_adaptive(settings, predict, waiting), interval="1s", wait_count=3)
    return cluster


def recorded_times(ws: Workspace, targets: Any) -> Callable[[str], float | None]:
    """``predict(target id)`` -> the predicted p50 compile seconds of that target
    (:func:`neuron_build.build.fleet.predict.predicted_seconds`: the ledger's same key, same target, same model and
    bucket, then a prior), None when nothing is known or the target is not one of ``targets``."""
    from neuron_build.build.fleet.predict import predicted_seconds

    by_id = {t.id: t for t in targets}
    cache: dict[str, float | None] = {}

    def predict(tid: str) -> float | None:
        if tid not in cache:
            t = by_id.get(tid)
            cache[tid] = predicted_seconds(ws, t) if t is not None else None
        return cache[tid]

    return predict


@contextmanager
def started_cluster(project: Any, predict: Callable[[str], float | None]) -> Iterator[Any]:
    """For ``[dask] cluster = "slurm"``: yields a :class:`~neuron_build.build.fleet.slurm_wait.SlurmStart`, which
    starts the cluster on first call (so a build with nothing to compile submits no job) and returns its
    scheduler's address; the cluster (its jobs cancelled) is closed on exit. For ``cluster = "scheduler"``:
    yields None (use ``[build] scheduler``).

    ``predict(target id)``: the predicted compile seconds of a target (None: unknown).
    """
    from neuron_build.build.fleet.slurm_wait import SlurmStart

    if project.config.dask.cluster != "slurm":
        yield None
        return
    settings, root, path = project.config.dask, Path(project.root), project.path
    start = SlurmStart(project, lambda waiting: slurm_cluster(settings, root, predict, path, waiting))
    try:
        yield start
    finally:
        start.close()


__all__ = ["DEFAULT_COMPILE_S", "check_job_script", "make_adaptive", "recorded_times", "scale_target", "slurm_cluster",
           "started_cluster", "target_of_task", "worker_args"]
