"""The fleet's dispatch policy: which ready compile starts on which worker, as slots free.

A pure policy object (no Dask, no clock, no I/O): the Dask executor (:mod:`neuron_build.build.fleet.dask_executor`)
and the simulator (``benchmarks/fleet_sim.py``) both drive one :class:`Dispatcher` by telling it what happened
(a worker joined or was lost, a compile finished, ran out of memory) and asking :meth:`Dispatcher.assign` what
to start now.

The policy (``../shared/compile-fleet.md`` §3, §5):

* **Longest first (LPT) over the graph**: a job's rank is its predicted p90 seconds (the p50 when no p90 is
  given) plus the largest rank of the jobs that wait for it (a model's priority graph carries its longest
  bucket), and ready jobs go out highest rank first. List scheduling in arbitrary order guarantees only
  2 - 1/m of the optimal makespan, LPT 4/3 - 1/(3m) (Graham 1969). The p90, not the p50, because the
  makespan is lost to a long compile started late: a job whose time is uncertain (a never-built model,
  predicted by the prior) may be far longer than its p50, so it goes out before a job of the same p50
  that is known well (measured in ``benchmarks/fleet_sim.py``: lpt_predicted 1.215 -> 1.109 x the lower
  bound with true memory, seed 1).
* **Packed by memory**: a job starts only on a worker with a free slot whose memory holds the p90 of the sum of
  the peaks running there with it: the sum of their p50s plus 1.28 standard deviations of the sum (each job's
  deviation taken as (p90 - p50) / 1.28, the peaks as independent), and never less than the job's own p90.
  Alone on a worker a job gets its p90; ten together need far less than ten p90s (what a fleet short of memory
  needs). Among the workers that can take it, the one it fits most tightly (best fit), so large workers stay
  free for large jobs.
  A ready job that fits no worker now but fits some worker's capacity reserves the emptiest such worker
  (nothing smaller starts there until it fits), at most :attr:`Dispatcher.max_reserved` at once.
* **Lifetime**: a job does not start on a worker whose remaining lifetime (``--lifetime`` below a Slurm
  walltime) is shorter than the job's p90 time.
* **Out of memory**: retried once, on a worker with more memory than the one it died on; with none in the
  fleet, it fails with one line ("no worker big enough").
* **A lost worker is not a failure**: its running jobs go back to the ready queue (their lease is released
  by the executor, or expires).

Units: seconds and bytes; the clock (``now``) is whatever the driver uses (monotonic seconds).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

#: The start of the one-line reason of a job that fits no worker of the fleet.
NO_WORKER = "no worker big enough"
#: z of the 90th percentile of a normal distribution.
Z90 = 1.2816
#: Ready jobs, from the top of the queue, that may reserve a worker when none of the free ones can take them.
HEAD = 64


@dataclass
class Job:
    """A compile to dispatch.

    Attributes:
        id: the target id.
        seconds: predicted p50 wall time, seconds.
        memory: predicted p90 peak memory, bytes.
        memory_p50: predicted p50 peak memory, bytes (None: the same as ``memory``, no spread).
        seconds_p90: predicted p90 wall time, seconds (orders the queue; checked against a worker's remaining
            lifetime); defaults to ``seconds``.
        after: ids of the jobs that must finish first (a model's priority graph).
    """

    id: str
    seconds: float
    memory: int
    seconds_p90: float | None = None
    after: tuple[str, ...] = ()
    memory_p50: int | None = None
    #: capacity the job needs more than (set by an out-of-memory kill), bytes
    needs_more_than: int = 0
    oom_retries: int = 0


@dataclass
class WorkerSlot:
    """A worker as the policy sees it: ``memory`` (bytes) and ``slots`` it offers, ``lifetime_end`` (clock
    seconds when it will be retired; None: never), and what runs on it now (job id -> memory reserved)."""

    name: str
    memory: int
    slots: int
    lifetime_end: float | None = None
    running: dict[str, tuple[int, float]] = field(default_factory=dict)  # job -> (p50 bytes, variance)
    used: int = 0
    var: float = 0.0

    @property
    def free_memory(self) -> int:
        """Bytes left beside the p90 of the sum of the peaks running on it."""
        return int(self.memory - self.used - Z90 * math.sqrt(max(self.var, 0.0)))

    @property
    def free_slots(self) -> int:
        return self.slots - len(self.running)

    def take(self, job_id: str, p50: int, var: float = 0.0) -> None:
        """Reserve a job's p50 peak (bytes) and its variance (bytes squared) here."""
        self.running[job_id] = (p50, var)
        self.used += p50
        self.var += var

    def drop(self, job_id: str) -> None:
        p50, var = self.running.pop(job_id, (0, 0.0))
        self.used -= p50
        self.var = self.var - var if self.running else 0.0

    def spare(self, p50: int, p90: int, var: float) -> float:
        """Bytes left if a job of that p50, p90 and variance started here (negative: it does not fit)."""
        return min(self.memory - self.used - p50 - Z90 * math.sqrt(max(self.var + var, 0.0)), self.memory - p90)


def _p50(job: Job) -> int:
    return job.memory if job.memory_p50 is None else min(job.memory_p50, job.memory)


def _var(job: Job) -> float:
    """The variance of a job's peak, bytes squared, from its p50 and p90 (normal)."""
    return ((job.memory - _p50(job)) / Z90) ** 2


def _rank_seconds(job: Job) -> float:
    """The seconds a job is ranked by: its p90 time, else its p50 (never below zero)."""
    return max(job.seconds if job.seconds_p90 is None else max(job.seconds_p90, job.seconds), 0.0)


def _floor(b: int) -> float:
    """The least memory of a job in bin ``b``, bytes."""
    return 0.0 if b == 0 else 2**30 * 1.1 ** (b - 1)


def _bin(memory: int) -> int:
    """The memory class of a job's p50 peak: bins 10 % wide (1 GiB and below share bin 0)."""
    return max(0, int(math.log(max(memory, 1) / 2**30, 1.1)) + 1) if memory > 2**30 else 0


class Dispatcher:
    """Longest-predicted-first dispatch of jobs onto workers, packed by memory (see the module docstring).

    Args:
        jobs: every job of the build; a job's ``after`` may name jobs outside the list (taken as done).
        max_reserved: ready jobs that may each hold a worker while they wait for its memory.
        max_lifetime: seconds a fresh worker lives (e.g. its ``--lifetime``), when workers have lifetimes: a
            job whose p90 exceeds it would never start, so it asks only for half of it on a worker.

    Attributes:
        refused: job id -> one-line reason it will not run (no worker big enough).
        done: ids of the jobs that finished (passed or failed).
        oom_retries: out-of-memory kills retried on a bigger worker.
    """

    def __init__(self, jobs: Iterable[Job], max_reserved: int = 4, max_lifetime: float | None = None):
        self.jobs: dict[str, Job] = {j.id: j for j in jobs}
        self.max_reserved = max_reserved
        self.max_lifetime = max_lifetime
        self.workers: dict[str, WorkerSlot] = {}
        self.refused: dict[str, str] = {}
        self.done: set[str] = set()
        self.oom_retries = 0
        self.where: dict[str, str] = {}  # running job id -> worker name
        self._waiting: dict[str, set[str]] = {}
        self._children: dict[str, list[str]] = {}
        for j in self.jobs.values():
            deps = {d for d in j.after if d in self.jobs and d != j.id}
            self._waiting[j.id] = deps
            for d in deps:
                self._children.setdefault(d, []).append(j.id)
        self.rank = self._ranks()
        self._seq = {jid: n for n, jid in enumerate(self.jobs)}  # ties go in the given (matrix) order
        self._bins: dict[int, list[tuple[float, int, str]]] = {}  # memory class -> ready jobs, best first
        self._bin_of: dict[str, int] = {}
        for jid, deps in self._waiting.items():
            if not deps:
                self._push(jid)

    def _ranks(self) -> dict[str, float]:
        """Upward rank: own predicted p90 seconds plus the largest rank among the jobs waiting for it."""
        rank: dict[str, float] = {}
        order, seen = [], set()
        for root in self.jobs:  # iterative post-order (children before parents)
            if root in seen:
                continue
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    order.append(node)
                    continue
                if node in seen:
                    continue
                seen.add(node)
                stack.append((node, True))
                stack.extend((c, False) for c in self._children.get(node, ()) if c not in seen)
        for node in order:
            rank[node] = _rank_seconds(self.jobs[node]) + max((rank[c] for c in self._children.get(node, ())),
                                                              default=0.0)
        return rank

    # -- what happened ----------------------------------------------------------------------------------
    def add_worker(self, name: str, memory: int, slots: int, lifetime_end: float | None = None) -> None:
        """A worker joined (or changed: its capacity is replaced, what runs on it is kept)."""
        old = self.workers.get(name)
        self.workers[name] = WorkerSlot(name, int(memory), int(slots), lifetime_end, old.running if old else {})

    def lose_worker(self, name: str) -> list[str]:
        """A worker left (lost, retired, preempted): its running jobs go back to the ready queue, not counted
        as failures. Returns their ids."""
        w = self.workers.pop(name, None)
        if w is None:
            return []
        back = sorted(w.running)
        for jid in back:
            self.where.pop(jid, None)
            self._push(jid)
        return back

    def drain(self, name: str) -> None:
        """Start nothing more on worker ``name`` (it is retiring, or was lost and its running jobs wait for
        their leases to expire before :meth:`lose_worker`)."""
        w = self.workers.get(name)
        if w is not None:
            w.slots = 0

    def finished(self, job_id: str) -> list[str]:
        """``job_id`` finished (passed or failed deterministically): its slot and memory are freed and the
        jobs waiting only for it become ready. Returns those."""
        self._release(job_id)
        return self._complete(job_id)

    def _complete(self, job_id: str) -> list[str]:
        self.done.add(job_id)
        ready = []
        for c in self._children.get(job_id, ()):
            self._waiting[c].discard(job_id)
            if not self._waiting[c] and c not in self.done and c not in self.refused:
                self._push(c)
                ready.append(c)
        return ready

    def out_of_memory(self, job_id: str, peak_bytes: int | None = None) -> str | None:
        """``job_id`` was killed for memory on the worker it ran on, its process tree at ``peak_bytes``. The first
        time, it goes back to the queue reserving at least ``peak_bytes``, for a worker with more memory than
        that one (or, when ``peak_bytes`` is below that worker's memory, a kill among other compiles, for any
        worker with the room) and None is returned; otherwise (a second kill, or no bigger worker in the fleet)
        it is refused and the one-line reason is returned."""
        w = self.workers.get(self.where.get(job_id, ""))
        cap = w.memory if w is not None else self.jobs[job_id].memory
        self._release(job_id)
        job = self.jobs[job_id]
        job.memory = max(job.memory, int(peak_bytes or 0))
        job.memory_p50 = max(_p50(job), int(peak_bytes or 0))
        crowded = peak_bytes is not None and 0 < peak_bytes < cap  # killed beside others, not for its own size
        if not crowded:
            job.needs_more_than = max(job.needs_more_than, cap)
        if job.oom_retries >= 1:
            return self._refuse(job, f"{NO_WORKER}: ran out of memory twice, the second time on a worker with "
                                     f"{cap / 2**30:.0f} GiB")
        biggest = max((x.memory for x in self.workers.values()), default=0)
        if biggest <= cap and not crowded:
            return self._refuse(job, f"{NO_WORKER}: ran out of memory on a worker with {cap / 2**30:.0f} GiB and "
                                     f"no worker has more; add a worker with more memory")
        job.oom_retries += 1
        self.oom_retries += 1
        self._push(job_id)
        return None

    def revise(self, job_id: str, seconds: float, memory: int, seconds_p90: float | None = None,
               memory_p50: int | None = None) -> bool:
        """A better prediction for a job not started yet (e.g. its model's first compile finished): its times and
        memory are replaced and it is re-ranked (the ranks of the jobs it waits for are kept). The memory never
        drops below what an out-of-memory kill showed it needs. Returns False (nothing changed) for a job that
        runs, finished, was refused or is unknown."""
        job = self.jobs.get(job_id)
        if job is None or job_id in self.where or job_id in self.done or job_id in self.refused:
            return False
        queued = job_id in self._bin_of
        if queued:
            self._unqueue(job_id)
        floor = job.memory if job.oom_retries else 0
        job.seconds, job.seconds_p90 = seconds, seconds_p90
        job.memory = max(int(memory), floor)
        job.memory_p50 = None if memory_p50 is None else max(int(memory_p50), floor)
        self.rank[job_id] = _rank_seconds(job) + max((self.rank[c] for c in self._children.get(job_id, ())),
                                                     default=0.0)
        if queued:
            self._push(job_id)
        return True

    # -- what to start ----------------------------------------------------------------------------------
    def assign(self, now: float = 0.0) -> list[tuple[str, str]]:
        """The (job id, worker name) pairs to start now, highest rank first; each is marked running.

        The first :data:`HEAD` ready jobs, in rank order, either start or (when none of the free workers can
        take them) reserve a worker; after them, the best-ranked job that fits some free worker starts, until
        no free worker can take any (ready jobs are kept in memory classes, so this does not scan them all).
        """
        out: list[tuple[str, str]] = []
        if not self.workers or not self._bin_of:
            return out
        free = [w for w in self.workers.values() if w.free_slots > 0]
        if not free:
            return out
        free = self._assign_head(free, now, out)
        self._assign_rest(free, now, out)
        return out

    def _assign_head(self, free: list[WorkerSlot], now: float, out: list) -> list[WorkerSlot]:
        """The first :data:`HEAD` ready jobs: start, reserve a worker, or are refused. Returns the free workers
        left (reserved ones taken out)."""
        biggest = max(w.memory for w in self.workers.values())
        reserved: set[str] = set()
        room = max(w.free_memory for w in free)  # no job whose p50 exceeds this fits anywhere free
        for item in list(itertools.islice(heapq.merge(*self._bins.values()), HEAD)):
            if not free:
                break
            job = self.jobs[item[2]]
            if _p50(job) > room and len(reserved) >= self.max_reserved and job.memory <= biggest:
                continue  # fits no free worker now, and no reservation is left to make for it
            if job.memory > biggest or job.needs_more_than >= biggest:
                self._unqueue(job.id)
                self._refuse(job, f"{NO_WORKER}: needs {job.memory / 2**30:.1f} GiB"
                                  + (f" on a worker with more than {job.needs_more_than / 2**30:.0f} GiB"
                                     if job.needs_more_than else "")
                                  + f", the largest worker has {biggest / 2**30:.0f} GiB")
                continue
            w = self._best(job, free, now) if _p50(job) <= room else None
            if w is not None:
                self._start(job, w, free, out)
                room = max((x.free_memory for x in free), default=0)
            elif len(reserved) < self.max_reserved:
                hold = [x for x in self.workers.values() if x.name not in reserved and self._could(job, x, now)]
                if hold:
                    reserved.add(max(hold, key=lambda x: (x.free_memory, x.name)).name)
                    free = [x for x in free if x.name not in reserved]
                    room = max((x.free_memory for x in free), default=0)
        return free

    def _assign_rest(self, free: list[WorkerSlot], now: float, out: list) -> None:
        """After the head: the best-ranked job that fits some free worker starts, until none fits."""
        nofit: set[str] = set()  # fits none of the free workers: they only fill up during this call
        while free:
            room = max(w.free_memory for w in free)
            pick: tuple[float, int, str] | None = None
            where: WorkerSlot | None = None
            for b, items in self._bins.items():
                if not items or _floor(b) * 0.999 > room or (pick is not None and items[0] >= pick):
                    continue
                for item in items:
                    if pick is not None and item >= pick:
                        break
                    job = self.jobs[item[2]]
                    if _p50(job) > room or job.id in nofit:
                        continue
                    w = self._best(job, free, now)
                    if w is not None:
                        pick, where = item, w
                        break
                    nofit.add(job.id)
            if pick is None or where is None:
                break
            self._start(self.jobs[pick[2]], where, free, out)

    def _could(self, job: Job, w: WorkerSlot, now: float) -> bool:
        """Could ``job`` ever run on ``w`` (its capacity, its lifetime), once what runs there ends?"""
        p90 = job.seconds_p90 if job.seconds_p90 is not None else job.seconds
        if self.max_lifetime is not None and p90 > self.max_lifetime:
            p90 = self.max_lifetime / 2
        return (w.memory >= job.memory and w.memory > job.needs_more_than
                and (w.lifetime_end is None or now + p90 <= w.lifetime_end))

    def _best(self, job: Job, free: list[WorkerSlot], now: float) -> WorkerSlot | None:
        """The free worker ``job`` fits most tightly now (least memory left over), or None."""
        best, left = None, 0.0
        p50, var = _p50(job), _var(job)
        for w in free:
            spare = w.spare(p50, job.memory, var)
            if spare >= 0 and (best is None or (spare, w.name) < (left, best.name)) and self._could(job, w, now):
                best, left = w, spare
        return best

    def _start(self, job: Job, w: WorkerSlot, free: list[WorkerSlot], out: list) -> None:
        self._unqueue(job.id)
        w.take(job.id, _p50(job), _var(job))
        self.where[job.id] = w.name
        out.append((job.id, w.name))
        if w.free_slots <= 0:
            free.remove(w)

    # -- queries ----------------------------------------------------------------------------------------
    def priority(self, job_id: str) -> int:
        """An integer for Dask's ``priority=`` (higher runs first): the job's rank in whole seconds."""
        return int(self.rank.get(job_id, 0.0))

    @property
    def ready(self) -> list[str]:
        """Ids of the jobs ready to start, highest rank first."""
        return [i for *_, i in heapq.merge(*self._bins.values())]

    @property
    def running(self) -> dict[str, str]:
        """Running job id -> worker name."""
        return dict(self.where)

    # -- internals --------------------------------------------------------------------------------------
    def _push(self, job_id: str) -> None:
        b = _bin(_p50(self.jobs[job_id]))
        self._bin_of[job_id] = b
        bisect.insort(self._bins.setdefault(b, []), (-self.rank[job_id], self._seq[job_id], job_id))

    def _unqueue(self, job_id: str) -> None:
        b = self._bin_of.pop(job_id)
        items = self._bins[b]
        items.pop(bisect.bisect_left(items, (-self.rank[job_id], self._seq[job_id], job_id)))

    def _release(self, job_id: str) -> None:
        w = self.workers.get(self.where.pop(job_id, ""))
        if w is not None:
            w.drop(job_id)

    def _refuse(self, job: Job, why: str) -> str:
        self.refused[job.id] = why
        self._complete(job.id)  # what waited for it may still build (a bucket needs no other bucket's NEFF)
        return why


__all__ = ["NO_WORKER", "Dispatcher", "Job", "WorkerSlot"]
