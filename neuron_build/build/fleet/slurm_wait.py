"""The Slurm cluster of one Dask build (``[dask] cluster = "slurm"``): started when something is left to compile
(:class:`SlurmStart`), and the wait for its first worker, which says what Slurm does with the jobs instead of
waiting in silence.

A Slurm job's worker can fail to join for reasons that never end by themselves: a held job (``--hold``), a
partition that is down or whose limits the job exceeds, an invalid account or QOS, a job that ended before its
worker connected (a bad ``job_script_prologue``, a Python without neuron-build). :meth:`SlurmStart.wait_for_workers`
polls ``squeue`` (the job's state and Slurm's reason) while it waits and stops within ``[build]
scheduler_timeout_s`` on those, with the job's id, state, reason and log file; a job that only queues (Slurm's
reason ``Resources``, ``Priority``) is waited for up to ``[dask] start_timeout_s``, and the error then says the same.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError
from neuron_build.log import get_logger

#: Slurm's pending reasons that do not end by themselves (an admin or the user must act), from squeue(1)'s
#: JOB REASON CODES [doc] https://slurm.schedmd.com/squeue.html#SECTION_JOB-REASON-CODES
NEVER_ENDS = frozenset({"JobHeldUser", "JobHeldAdmin", "PartitionDown", "PartitionInactive", "PartitionTimeLimit",
                        "PartitionNodeLimit", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied",
                        "BadConstraints", "AccountNotAllowed", "QOSMaxWallDurationPerJobLimit",
                        "AssocMaxWallDurationPerJobLimit"})
#: Job states of a job that is over (squeue may still list it for ``MinJobAge`` seconds).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED", "REVOKED", "SPECIAL_EXIT"})
#: Seconds between two looks at the queue while waiting for a first worker.
POLL_S = 1.0
#: The Slurm job name dask-jobqueue's log files are named after (``<name>-<job id>.err``).
JOB_NAME = "neuron-build"


def _job_order(job_id: str) -> tuple[int, str]:
    """Job ids in submission order (numbers, not text: job 10 after job 9)."""
    return (int(job_id), "") if job_id.isdigit() else (0, job_id)


def queue_states(job_ids: Iterable[str], user: str | None = None) -> dict[str, tuple[str, str]] | None:
    """job id -> (state, reason) of those of ``job_ids`` that Slurm still holds (``squeue``: pending, running,
    completing); a job that ended (gone, or in a state of :data:`ENDED`) is absent. None when ``squeue`` fails
    (nothing known)."""
    ids = set(job_ids)
    if not ids:
        return {}
    try:
        r = subprocess.run(["squeue", "-h", "-u", user or getpass.getuser(), "-o", "%i|%T|%r"], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    out = {}
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in ids and parts[1] not in ENDED:
            out[parts[0]] = (parts[1], parts[2])
    return out


class SlurmStart:
    """Starts the build's ``SLURMCluster`` on first call (``make``: :func:`~neuron_build.build.fleet.clusters.slurm_cluster`)
    and waits for its first worker (:meth:`wait_for_workers`); :meth:`close` cancels its jobs.

    Args:
        project: the loaded project (``[dask]``, ``[build] scheduler_timeout_s``, its folder and config path).
        make: ``make(waiting)`` -> the started cluster (``slurm_cluster`` with the project's settings).
    """

    def __init__(self, project: Any, make: Callable[[Callable[[], Iterable[str]] | None], Any]):
        self.settings = project.config.dask
        self.root = Path(project.root)
        self.config_file = project.path
        self.stuck_s = float(project.config.build.scheduler_timeout_s)
        self.make = make
        self.cluster: Any = None
        self.log = get_logger(executor="dask", cluster="slurm")

    def __call__(self, waiting: Callable[[], Iterable[str]] | None = None) -> str:
        """Start the cluster (once) and return its scheduler's address. ``waiting()``: the target ids the
        client still has to build; the cluster asks Slurm for jobs from them at once (from zero jobs too)."""
        if self.cluster is None:
            s = self.settings
            self.cluster = self.make(waiting)
            self.log.info("slurm cluster", scheduler=self.cluster.scheduler_address, minimum_jobs=s.minimum_jobs,
                          maximum_jobs=s.maximum_jobs, lifetime_s=s.lifetime_s)
        return self.cluster.scheduler_address

    def close(self) -> None:
        """Close the cluster (its Slurm jobs cancelled), if it was started."""
        if self.cluster is not None:
            self.cluster.close()

    def job_ids(self) -> set[str]:
        """The Slurm job ids of the cluster's workers now (submitted ones only)."""
        jobs = list(getattr(self.cluster, "workers", {}).values())
        return {str(j.job_id) for j in jobs if getattr(j, "job_id", None)}

    def log_of(self, job_id: str) -> str:
        """Where Slurm writes the output of job ``job_id``: ``[dask] log_directory``'s ``neuron-build-<id>.err``,
        else Slurm's default ``slurm-<id>.out`` in the folder the build ran in."""
        if self.settings.log_directory:
            return str((self.root / self.settings.log_directory).resolve() / f"{JOB_NAME}-{job_id}.err")
        return str(Path(os.getcwd()) / f"slurm-{job_id}.out")

    def wait_for_workers(self, client: Any, address: str) -> None:
        """Wait for a first worker to join the scheduler at ``address``, looking at the Slurm jobs meanwhile.

        Raises:
            UserError: a wait that cannot end (no job submitted after ``scheduler_timeout_s``, every job held
                or pending for a reason that does not end by itself, every job ended without a worker), or no
                worker within ``[dask] start_timeout_s``; one line naming the jobs, their state and reason,
                their log file and the fix.
        """
        t0 = time.monotonic()
        seen: set[str] = set()
        while True:
            try:
                client.wait_for_workers(1, timeout=POLL_S)
                return
            except TimeoutError:
                pass
            seen |= self.job_ids()
            problem = self.problem(seen, queue_states(seen), time.monotonic() - t0, address)
            if problem:
                raise UserError(f"{self.config_file}: [dask] cluster = \"slurm\": no Dask worker joined {address}: "
                                f"{problem}")

    def problem(self, seen: set[str], queue: dict[str, tuple[str, str]] | None, waited: float,
                address: str) -> str | None:
        """Why the wait for a first worker cannot end, or has lasted ``start_timeout_s`` (None: wait on).
        ``queue``: :func:`queue_states` of the jobs ``seen`` (None: squeue failed, only the timeout applies)."""
        s = self.settings
        if queue is None:  # squeue failed: nothing known of the jobs, only the timeout applies
            return self._timed_out(seen, "squeue did not answer") if waited >= s.start_timeout_s else None
        if not seen:
            if waited < self.stuck_s:
                return None
            return (f"no Slurm job was submitted within {self.stuck_s:g} s ([build] scheduler_timeout_s; [dask] "
                    f"maximum_jobs = {s.maximum_jobs}); check that sbatch works here (sbatch --test-only) and "
                    f"that the cluster's scheduler started (the log above)")
        blocked = {j: queue[j] for j in sorted(seen) if j in queue and queue[j][1] in NEVER_ENDS}
        if blocked and len(blocked) == len(queue):
            j, (state, reason) = next(iter(blocked.items()))
            fix = (f"release it (scontrol release {j}) or remove --hold from [dask] job_extra_directives"
                   if reason.startswith("JobHeld") else
                   "fix [dask] queue, account, walltime or job_extra_directives")
            return (f"Slurm job {j} is {state} ({reason}), which does not end by itself; {fix} (squeue -j {j}; "
                    f"its log: {self.log_of(j)})")
        if not queue and waited >= self.stuck_s:
            j = max(seen, key=_job_order)
            return (f"Slurm job {j} ended before its worker connected; read its log {self.log_of(j)} (a failing "
                    f"[dask] job_script_prologue, a python without neuron-build, a scheduler_host or interface the "
                    f"job cannot reach)")
        if waited < s.start_timeout_s:
            return None
        return self._timed_out(seen, ", ".join(f"job {j} {state} ({reason})" for j, (state, reason)
                                               in sorted(queue.items())) or "no job left")

    def _timed_out(self, seen: set[str], jobs: str) -> str:
        """The end of a wait of ``start_timeout_s`` for the jobs ``seen`` (``jobs``: what squeue says of them)."""
        log = self.log_of(max(seen, key=_job_order)) if seen else "none yet"
        return (f"none within {self.settings.start_timeout_s:g} s ([dask] start_timeout_s); Slurm: {jobs}; a "
                f"PENDING job waits for the cluster (raise start_timeout_s, or ask for less: [dask] cores, memory, "
                f"queue), a RUNNING one cannot reach the scheduler ([dask] scheduler_host, interface; its log: {log})")


__all__ = ["ENDED", "NEVER_ENDS", "SlurmStart", "queue_states"]
