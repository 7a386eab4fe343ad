"""``[dask]`` of ``buckets.toml``: where the Dask workers of ``executor = "dask"`` come from.

``cluster = "scheduler"`` (the default) uses a running scheduler (``[build] scheduler``); ``cluster = "slurm"``
makes the workers as Slurm jobs through dask-jobqueue's ``SLURMCluster`` (one ``sbatch`` job per worker, the
scheduler in the client's process), scaled between ``minimum_jobs`` and ``maximum_jobs`` from the predicted
work (:mod:`neuron_build.build.fleet.clusters`). Only the schema lives here: loading a config never imports Dask.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, field_validator, model_validator

ClusterKind = Literal["scheduler", "slurm"]

#: Slurm's time formats (``sbatch --time``): "minutes", "minutes:seconds", "hours:minutes:seconds",
#: "days-hours", "days-hours:minutes", "days-hours:minutes:seconds" [doc] https://slurm.schedmd.com/sbatch.html
_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
#: The sizes dask-jobqueue's ``memory`` takes (``dask.utils.parse_bytes``): a number and a unit.
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|kB|KB|MB|GB|TB|PB|KiB|MiB|GiB|TiB|PiB|K|M|G|T)$")
_UNITS = {"B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "KB": 10**3, "kB": 10**3,
          "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
          "TiB": 2**40, "PiB": 2**50}
#: Shortest walltime accepted, seconds: a worker must live long enough to start and take a compile.
MIN_WALLTIME_S = 120


def walltime_seconds(text: str) -> int:
    """Seconds of a Slurm time string (``"01:30:00"`` -> 5400, ``"2-00:00:00"`` -> 172800, ``"90"`` -> 5400).

    Raises:
        ValueError: not one of Slurm's formats (the message names them).
    """
    m = _WALLTIME.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time; write \"HH:MM:SS\" (or \"D-HH:MM:SS\", \"MM\")")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def memory_bytes(text: str) -> int:
    """Bytes of a dask-jobqueue memory size (``"16GB"`` -> 16e9, ``"4GiB"`` -> 4 * 2**30).

    Raises:
        ValueError: no number with a unit (the message gives an example).
    """
    m = _MEMORY.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a memory size; write a number and a unit such as \"16GB\" or \"64GiB\"")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def lifetime_margin_s(walltime_s: int) -> int:
    """Seconds before the walltime at which a worker stops taking work by default: a tenth of the walltime,
    at least 60 s and at most 15 minutes (dask-jobqueue's advice is ``--lifetime`` a few minutes below the
    walltime [doc] dask-jobqueue ``clusters-advanced-tips-and-tricks``)."""
    return int(min(max(walltime_s / 10, 60), 900))


def _not_bool(v):
    if isinstance(v, bool):
        raise ValueError("must be a whole number, not true/false")
    if isinstance(v, str):  # "600" would pass as 600.0 in pydantic's lax mode
        raise ValueError(f"{v!r} is a string; write the number without quotes")
    return v


Count = Annotated[int, BeforeValidator(_not_bool), Field(strict=True)]


class DaskSettings(BaseModel):
    """``[dask]``: the cluster the Dask executor runs on.

    ``cluster``: ``"scheduler"`` (connect to ``[build] scheduler``) or ``"slurm"`` (start workers as Slurm
    jobs through dask-jobqueue's ``SLURMCluster``; install ``neuron-build[slurm]``). For Slurm, the fields
    users of ``sbatch`` know: ``queue`` (the partition; unset: the cluster's default), ``account``,
    ``cores`` (CPUs per job, ``--cpus-per-task``), ``memory`` (per job, e.g. ``"256GB"``; each worker
    advertises it as its ``memory_gb`` resource, GB = 1e9 bytes), ``walltime`` (Slurm's ``--time``,
    ``"HH:MM:SS"``), ``processes`` (Dask workers per job; each gets ``cores / processes`` threads, one
    compile per thread), ``job_extra_directives`` (more ``#SBATCH`` lines, e.g. ``["--exclusive"]``),
    ``job_script_prologue`` (shell lines run before the worker starts, e.g. ``["source /opt/venv/bin/activate"]``),
    ``minimum_jobs`` / ``maximum_jobs`` (the scale bounds), ``lifetime_margin_s`` (a worker stops taking work
    this many seconds before its walltime: ``--lifetime`` = walltime - margin, ``--lifetime-stagger`` = a
    quarter of the margin; default a tenth of the walltime, 60 s to 15 min), ``scheduler_host`` (the address
    the workers reach the client's scheduler at; unset: dask-jobqueue's choice, through ``interface``),
    ``interface`` (the network interface the scheduler and workers listen on, e.g. ``"ens5"``),
    ``log_directory`` (where Slurm writes the jobs' output; relative to the config's folder),
    ``start_timeout_s`` (seconds to wait for a first worker: jobs queue), ``target_duration_s`` (the jobs
    asked for are enough to finish the predicted work in about this many seconds, as Dask's own
    ``target_duration``, within the bounds).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: ClusterKind = "scheduler"
    queue: StrictStr | None = None
    account: StrictStr | None = None
    cores: Count = Field(default=1, ge=1)
    processes: Count = Field(default=1, ge=1)
    memory: StrictStr = "4GB"
    walltime: StrictStr = "01:00:00"
    job_extra_directives: tuple[StrictStr, ...] = ()
    job_script_prologue: tuple[StrictStr, ...] = ()
    minimum_jobs: Count = Field(default=0, ge=0)
    maximum_jobs: Count = Field(default=4, ge=1)
    lifetime_margin_s: Count | None = Field(default=None, ge=1)
    scheduler_host: StrictStr | None = None
    interface: StrictStr | None = None
    log_directory: StrictStr | None = None
    start_timeout_s: Annotated[float, BeforeValidator(_not_bool)] = Field(default=600.0, gt=0, allow_inf_nan=False)
    target_duration_s: Annotated[float, BeforeValidator(_not_bool)] = Field(default=1800.0, gt=0, allow_inf_nan=False)

    @field_validator("walltime")
    @classmethod
    def _walltime(cls, v: str) -> str:
        if walltime_seconds(v) < MIN_WALLTIME_S:
            raise ValueError(f"{v!r} is under {MIN_WALLTIME_S} s; a worker needs time to start and compile")
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        if memory_bytes(v) <= 0:
            raise ValueError(f"{v!r} is no memory; a worker advertises it, and no compile fits in none")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> DaskSettings:
        unused = sorted(self.model_fields_set - {"cluster"}) if self.cluster == "scheduler" else []
        if unused:
            raise ValueError(f"{', '.join(unused)} only apply to cluster = \"slurm\", and cluster is "
                             f"\"scheduler\"; set cluster = \"slurm\" or remove them")
        if self.minimum_jobs > self.maximum_jobs:
            raise ValueError(f"minimum_jobs ({self.minimum_jobs}) is above maximum_jobs ({self.maximum_jobs}); "
                             "lower minimum_jobs or raise maximum_jobs")
        if self.processes > self.cores:
            raise ValueError(f"processes ({self.processes}) is above cores ({self.cores}); each worker process "
                             "needs at least one core")
        if self.lifetime_margin_s is not None and self.lifetime_margin_s * 2 > self.walltime_s:
            raise ValueError(f"lifetime_margin_s ({self.lifetime_margin_s}) is over half the walltime "
                             f"({self.walltime}); lower it or raise walltime")
        return self

    def timeout_fault(self, timeout_s: float) -> str | None:
        """With ``cluster = "slurm"``: the one line when a worker's life (the walltime less its lifetime margin)
        is shorter than a compile may take (``[build] timeout_s``); None otherwise."""
        if self.cluster != "slurm" or self.lifetime_s >= timeout_s:
            return None
        return (f"dask.walltime: {self.walltime!r} lets a worker run {self.lifetime_s} s (the walltime less its "
                f"lifetime margin of {self.margin_s} s), less than [build] timeout_s ({timeout_s:g} s): a compile "
                f"that runs its full time would be stopped with its Slurm job; raise walltime or lower timeout_s")

    @property
    def walltime_s(self) -> int:
        """``walltime`` in seconds."""
        return walltime_seconds(self.walltime)

    @property
    def margin_s(self) -> int:
        """Seconds between a worker's ``--lifetime`` and its job's walltime."""
        return self.lifetime_margin_s or lifetime_margin_s(self.walltime_s)

    @property
    def lifetime_s(self) -> int:
        """A worker's ``--lifetime``, seconds: the walltime less the margin (its stagger is a quarter of the
        margin, so the latest a worker stops is three quarters of the margin before the walltime)."""
        return self.walltime_s - self.margin_s

    @property
    def memory_bytes(self) -> int:
        """``memory`` in bytes (per job)."""
        return memory_bytes(self.memory)


__all__ = ["MIN_WALLTIME_S", "DaskSettings", "lifetime_margin_s", "memory_bytes", "walltime_seconds"]
