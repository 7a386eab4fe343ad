"""The Dask executor: one task per target on a Dask distributed cluster, each publishing straight into the
shared store.

``[build] executor = "dask"`` (or ``neuron-build build --executor dask``) with ``scheduler =
"tcp://host:8786"`` (or ``--scheduler``, or Dask's ``DASK_SCHEDULER_ADDRESS``). The client (:class:`DaskBuild`)
plans as a local build does, refuses to start unless every worker sees the same store, and submits one
``Client.submit(compile_task, ..., pure=False)`` per target as the dispatcher releases it, collected with
``distributed.as_completed`` (reaching the scheduler and checking the workers' store:
:mod:`neuron_build.build.fleet.connect`). On the worker (:mod:`neuron_build.build.fleet.dask_worker`),
:func:`compile_task` opens the store from its location, loads the project from the same config path (each
worker host needs the checkout at that path: a shared mount or the same clone), checks it computes the same
key, and runs the same :class:`~neuron_build.build.builder.Builder`
as a local build: the key's store lock (so two clients never compile one key twice), the worker subprocess
(:class:`~neuron_build.build.local.LocalExecutor`: timeout, peak memory, failure classes), staging, seal,
publish, failure records. The manifest records ``executor = "dask"`` and the worker's address.

Scheduling: the client holds the queue (:class:`~neuron_build.build.fleet.dispatch.Dispatcher`, predictions from
:mod:`neuron_build.build.fleet.predict`): as slots free it releases the ready target with the longest predicted
compile to the worker it fits most tightly by predicted memory (the smaller of ``--memory-limit`` and a
``memory_gb`` resource, GB = 1e9 bytes; unbounded without either), pinned there with ``priority=`` and, when
workers advertise ``memory_gb``, its p50 peak as a resource. An out-of-memory kill is retried once on a
worker with more memory; a worker that leaves has its tasks cancelled and put back in the queue (not a
failure). A transient failure (exit status 70) raises :class:`TransientCompileError`
on the worker, which Dask retries (``retries=[build] transient_retries``, on the same worker);
deterministic failures are returned, never retried. A worker that dies mid-compile takes its compile
subprocess with it (``PR_SET_PDEATHSIG``); its staging folder is never published, and the client puts
the target back in its queue for another worker. A cancelled task (Ctrl-C on the client, or a client that went
away) kills its compile within 0.2 s (the executor polls the worker's task state).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import Outcome, as_status
from neuron_build.build.fleet.connect import CONNECT_TIMEOUT_S, check_workers, connect, scheduler_address
from neuron_build.build.fleet.dask_worker import (
    MEMORY_RESOURCE,
    StoreSpec,
    TransientCompileError,
    compile_task,
    executing_keys,
    memory_bound,
    open_spec,
    probe_store,
)
from neuron_build.build.fleet.predict import dispatch_jobs, target_predictions
from neuron_build.build.peaks import expected_peak
from neuron_build.build.progress import BuildProgress, estimate_eta, pace, progress_line
from neuron_build.errors import UserError
from neuron_build.log import get_logger
from neuron_build.project.matrix import Target
from neuron_build.status import BuildResult, Status
from neuron_build.store.budget import GB
from neuron_build.workspace import Workspace

#: Seconds between the client's looks at the cluster (finished tasks, who runs what).
POLL_S = 0.5
#: The memory the dispatcher gives a worker that advertises no bound, bytes.
UNBOUNDED = 2**62


# -- where the workers publish (StoreSpec and probe_store: dask_worker.py) ------------------------------
def shared_store_spec(project: Any) -> StoreSpec:
    """The store Dask workers publish into: ``[build] remote`` with its ``remote_options`` when the project
    has a remote store, else ``[build] store`` (an absolute folder path)."""
    remote = project.remote_url()
    if remote:
        return StoreSpec(str(remote), dict(project.config.build.remote_options or {}))
    return StoreSpec(project.store_url(), {})


# -- on the client ----------------------------------------------------------------------------------------
def _as_outcome(d: dict[str, Any]) -> Outcome:
    status = BuildResult.CACHED if d["status"] == BuildResult.CACHED else as_status(d["status"])
    return Outcome(d["target"], d["key"], status, d.get("reason", ""), compiled=bool(d.get("compiled")),
                   metrics=dict(d.get("metrics") or {}), rechecked=tuple(d.get("rechecked") or ()))


class DaskBuild:
    """Builds targets of one project on a Dask cluster (the client side).

    Args:
        ws: the client's opened project (:class:`~neuron_build.workspace.Workspace`: keys, the store it reads).
        address: the scheduler (``tcp://host:8786``), or a function that starts a cluster and returns its
            scheduler's address (called only when something is left to compile, with a function returning
            the ids of the targets still to build, from which the cluster scales: see
            :class:`~neuron_build.build.fleet.slurm_wait.SlurmStart`; its ``wait_for_workers``, if any, is the wait
            for a first worker).
        retry_failed: compile targets whose current key failed last time (default True).
        report: called with each progress line (e.g. print to stderr); None: log only.
        connect_timeout_s: seconds to wait for the scheduler and for a first worker.
        display: makes the live progress display of the compiles, ``display(total, slots, expected)``
            (targets, worker threads, target id -> expected compile seconds or None), e.g. a
            :class:`~neuron_build.build.display.BuildDisplay`; it may return None. While a live display
            shows, ``report`` gets no lines (the display prints one per finished target).

    Attributes after :meth:`run`:
        outcomes: target id -> Outcome.
        workers: target id -> address of the worker whose result came back.
    """

    def __init__(self, ws: Workspace, address: str | Callable[..., str], retry_failed: bool = True,
                 report: Callable[[str], None] | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 display: Callable[[int, int, dict], Any] | None = None):
        self.ws = ws
        self.display = display
        self.address = address
        self.retry_failed = retry_failed
        self.report = report
        self.connect_timeout_s = connect_timeout_s
        self.outcomes: dict[str, Outcome] = {}
        self.workers: dict[str, str] = {}
        self.log = get_logger(executor="dask")

    def run(self, targets: Sequence[Target]) -> dict[str, Outcome]:
        """Compile every target of ``targets`` the store lacks, one Dask task each; return the outcomes.
        First, as a build on this host does, the pushes earlier builds here left pending are retried (those
        that fail again are in the store's ``push_failures``, which the build's end reports).

        Raises:
            UserError: the scheduler is unreachable, no worker joined, or the workers cannot reach the store.
            KeyboardInterrupt: after cancelling every task (their compiles are killed on the workers).
        """
        from neuron_build.store.identity import store_id

        ws = self.ws
        ws.store.push_pending()
        spec = shared_store_spec(ws.project)
        todo = []
        for t in targets:
            if ws.store.repair(ws.key(t).key).hit:
                self.outcomes[t.id] = Outcome(t.id, ws.key(t).key, BuildResult.CACHED)
            else:
                todo.append(t)
        if not todo:
            return self.outcomes
        wait = None
        if callable(self.address):  # a cluster started for this build (clusters.started_cluster): only now
            start = self.address
            wait = getattr(start, "wait_for_workers", None)
            self.address = start(lambda: [t.id for t in todo if t.id not in self.outcomes])
        client = connect(self.address, self.connect_timeout_s)
        try:
            try:
                ident = store_id(open_spec(spec))
            except (OSError, ValueError) as e:
                raise UserError(f"cannot read or write the identity of the store {spec.location} ({e}); the Dask "
                                f"executor needs a store it can write, or build here with --executor local") from None
            workers = check_workers(client, spec, ident, self.address, self.connect_timeout_s, wait)
            self._submit_and_collect(client, todo, spec, ident, workers)
        finally:
            client.close()
        return self.outcomes

    def _job(self, t: Target, spec: StoreSpec, ident: str, build_id: str) -> dict[str, Any]:
        ws = self.ws
        return {"config": str(Path(ws.project.path).resolve()), "target": t.id, "key": ws.key(t).key,
                "backend": ws.keys.backend, "store": {"location": spec.location, "options": spec.options}, "store_id": ident,
                "retry_failed": self.retry_failed, "build_id": build_id, "scheduler": self.address}

    def _too_big(self, t: Target, largest: int) -> str | None:
        """Why ``t`` is not submitted: its current key's last compile ran out of memory on a worker whose
        bound was at least ``largest`` (the largest bound of the workers now, bytes; 0: none bounded), so
        it would again. None when it may be submitted."""
        from neuron_build.build.attempt import OUT_OF_MEMORY

        fail = self.ws.store.failure(t.id)
        if (fail is None or fail.key != self.ws.key(t).key or not str(fail.reason).startswith(OUT_OF_MEMORY)
                or not largest or fail.peak_rss_bytes <= largest):
            return None
        return (f"not retried: its last compile ran {OUT_OF_MEMORY} at {fail.peak_rss_bytes / 2**20:.0f} MiB "
                f"({fail.peak_rss_bytes} bytes) and the largest Dask worker may use {largest / 2**20:.0f} MiB "
                f"({largest} bytes); add a worker with more memory (dask worker --memory-limit, --resources "
                f"memory_gb=N), or build it here with --executor local")

    def _resources(self, t: Target, workers: dict) -> dict[str, float] | None:
        """``{"memory_gb": expected peak}`` when some worker advertises memory, capped at the largest."""
        mems = [float((w.get("resources") or {}).get(MEMORY_RESOURCE)) for w in workers.values()
                if (w.get("resources") or {}).get(MEMORY_RESOURCE) is not None]
        if not mems:
            return None
        cfg = self.ws.project.config.build
        peak = expected_peak(self.ws.store, t.model, t.bucket_id, int(cfg.default_compile_memory_gb * GB))
        want = round(peak.bytes / GB, 3)
        if want > max(mems):
            self.log.warning("expected peak above every worker's memory_gb", target=t.id, expected_gb=want,
                             largest_gb=max(mems))
            want = max(mems)
        return {MEMORY_RESOURCE: want}

    def _submit_and_collect(self, client: Any, todo: list[Target], spec: StoreSpec, ident: str, workers: dict) -> None:
        from distributed import as_completed

        ws = self.ws
        build_id = secrets.token_hex(4)
        retries = ws.project.config.build.transient_retries
        futures: dict[Any, Target] = {}
        todo, predicted, dispatch = self._dispatcher(todo, workers)
        by_id = {t.id: t for t in todo}
        tries: dict[str, int] = {}
        advertised = any(MEMORY_RESOURCE in (w.get("resources") or {}) for w in workers.values())

        def submit_ready() -> None:
            for tid, addr in dispatch.assign(time.monotonic()):
                t = by_id[tid]
                tries[tid] = tries.get(tid, 0) + 1
                kw = self._placement(dispatch, tid, addr, advertised)
                fut = client.submit(compile_task, self._job(t, spec, ident, build_id), pure=False, retries=retries,
                                    key=f"neuron-build-{t.id}-{ws.key(t).key[:12]}-{build_id}-{tries[tid]}", **kw)
                futures[fut] = t
                by_key[fut.key] = t
                ac.add(fut)

        expected = {t.id: predicted[t.id].seconds for t in todo}
        paced: list[tuple[float | None, float | None]] = []  # (predicted, real) seconds of finished compiles
        by_key: dict[Any, Target] = {}
        started: dict[str, float] = {}
        done = failed = 0
        last_state: tuple = ()
        slots = sum(int(w.get("nthreads", 1)) for w in workers.values()) or 1
        total = len(todo)
        display = self.display(total, slots, expected) if self.display is not None else None
        live = display is not None and display.live
        shown: set[str] = set()
        ac = as_completed([], loop=client.loop)
        submit_ready()
        self.log.info("dispatching", targets=total, scheduler=self.address, workers=len(workers))
        try:
            while done < total:
                for fut in ac.next_batch(block=False) if ac.has_ready() else []:
                    t = futures.pop(fut)
                    if fut.cancelled():  # its worker left: the dispatcher put it back in the queue
                        continue
                    out = self._collect(fut, t)
                    if self._retry_bigger(dispatch, t, out):
                        continue
                    dispatch.finished(t.id)
                    paced.append((expected[t.id], out.compiled and (out.metrics or {}).get("compile_time_s")))
                    self.outcomes[t.id] = out
                    done += 1
                    failed += 0 if out.ok else 1
                    started.pop(t.id, None)
                    self._show_finished(display, t.id, out, shown)
                self._follow_workers(client, dispatch, futures)
                submit_ready()
                running = self._running(client, by_key, started)
                self._show_started(display, running, shown)
                now = time.monotonic()
                pending = [expected[t.id] for t in todo if t.id not in self.outcomes and t.id not in running]
                eta = estimate_eta(pending, [(expected[tid], now - started[tid]) for tid in running], slots,
                                   pace(paced))
                state = (done, failed, tuple(sorted(running.items())))
                if self.report is not None and not live and state != last_state:  # a line per change, not per tick
                    self.report(progress_line(BuildProgress(total, done, failed, running, eta)))
                last_state = state
                refused = self._refused(dispatch, by_id)
                done, failed = done + refused, failed + refused
                if done < total:
                    time.sleep(POLL_S)
        except BaseException:  # Ctrl-C (KeyboardInterrupt) included: cancel everything, then re-raise
            self._cancel_all(client, futures)
            raise
        finally:
            if display is not None:
                display.stop()

    def _dispatcher(self, todo: list[Target], workers: dict) -> tuple[list[Target], dict, Any]:
        """(the targets to submit, their predictions, the :class:`~neuron_build.build.fleet.dispatch.Dispatcher` of
        them over ``workers``): ``todo`` without what :meth:`_drop_too_big` refuses, each job capped by
        :meth:`_cap_at_largest`."""
        from neuron_build.build.fleet.dispatch import Dispatcher

        todo = self._drop_too_big(todo, workers)
        predicted = target_predictions(self.ws, todo)
        jobs = dispatch_jobs(todo, predicted, self.ws.project.config.build.default_compile_memory_gb)
        self._cap_at_largest(jobs, workers)
        dispatch = Dispatcher(jobs)
        self._sync_workers(dispatch, workers)
        return todo, predicted, dispatch

    @staticmethod
    def _placement(dispatch: Any, tid: str, addr: str, advertised: bool) -> dict[str, Any]:
        """``Client.submit``'s placement of target ``tid`` on worker ``addr``: pinned there with the dispatcher's
        priority and, when workers advertise :data:`MEMORY_RESOURCE` (``advertised``), the p50 peak the
        dispatcher reserved (capped at the worker's memory, GB) as a resource."""
        kw: dict[str, Any] = {"workers": [addr], "allow_other_workers": False, "priority": dispatch.priority(tid)}
        if advertised:  # within Dask's own accounting too: the p50 the dispatcher reserved
            p50 = dispatch.jobs[tid].memory_p50 or dispatch.jobs[tid].memory
            kw["resources"] = {MEMORY_RESOURCE: round(min(p50, dispatch.workers[addr].memory) / GB, 3)}
        return kw

    def _cancel_all(self, client: Any, futures: dict) -> None:
        """Cancel every task of ``futures`` not done yet."""
        left = [f for f in futures if not f.done()]
        self.log.warning("cancelling", tasks=len(left))
        if left:
            client.cancel(left, force=True)  # returns once the scheduler took it; workers kill the compiles

    def _drop_too_big(self, todo: list[Target], workers: dict) -> list[Target]:
        """``todo`` without the targets :meth:`_too_big` refuses (each gets its KILLED outcome and line)."""
        largest = max((memory_bound(w.get("memory_limit"), w.get("resources")) or 0 for w in workers.values()),
                      default=0)
        keep = []
        for t in todo:
            why = self._too_big(t, largest)
            if why is None:
                keep.append(t)
                continue
            self.outcomes[t.id] = Outcome(t.id, self.ws.key(t).key, Status.KILLED, why)  # not retried on that size
            self.log.error(str(Status.KILLED), target=t.id, reason=why)
            if self.report is not None:
                self.report(f"  FAILED {t.id}: KILLED: {why}")
        return keep

    def _cap_at_largest(self, jobs: list, workers: dict) -> None:
        """A prediction above every worker's memory is a guess until a compile is killed for it (then
        :meth:`_too_big` refuses the target before this): such a job asks for the largest worker's memory,
        with a warning, and runs."""
        largest = max((memory_bound(w.get("memory_limit"), w.get("resources")) or UNBOUNDED
                       for w in workers.values()), default=UNBOUNDED)
        for j in jobs:
            if j.memory > largest:
                self.log.warning("predicted peak above every worker's memory", target=j.id,
                                 predicted_bytes=j.memory, largest_bytes=largest)
                j.memory = largest
                j.memory_p50 = min(j.memory_p50 or largest, largest)

    def _refused(self, dispatch: Any, by_id: dict[str, Target]) -> int:
        """Record a KILLED outcome (the one-line reason) for each target the dispatcher refused (it fits no
        worker) that has none yet; returns how many."""
        n = 0
        for tid, why in dispatch.refused.items():
            if tid not in self.outcomes:
                self.outcomes[tid] = Outcome(tid, self.ws.key(by_id[tid]).key, Status.KILLED, why)
                self.log.error(str(Status.KILLED), target=tid, reason=why)
                if self.report is not None:
                    self.report(f"  FAILED {tid}: KILLED: {why}")
                n += 1
        return n

    def _show_finished(self, display: Any, tid: str, out: Outcome, shown: set[str]) -> None:
        if display is not None:
            if tid not in shown:
                display.started(tid, where=self.workers.get(tid))
            display.finished(out)

    @staticmethod
    def _show_started(display: Any, running: dict[str, str], shown: set[str]) -> None:
        if display is not None:
            for tid in sorted(set(running) - shown):
                display.started(tid, where=running[tid])
            shown |= set(running)

    def _sync_workers(self, dispatch: Any, workers: dict) -> None:
        """Tell ``dispatch`` the workers of the scheduler's table ``workers`` (address -> info): memory (the
        bound of :func:`memory_bound`; unbounded when none), slots (threads), and a lifetime when the info
        carries one (``lifetime_end``, monotonic seconds, as a cluster plug-in may add)."""
        for addr, w in workers.items():
            mem = memory_bound(w.get("memory_limit"), w.get("resources")) or UNBOUNDED
            if addr not in dispatch.workers or dispatch.workers[addr].memory != mem:
                dispatch.add_worker(addr, mem, int(w.get("nthreads") or 1), w.get("lifetime_end"))

    def _follow_workers(self, client: Any, dispatch: Any, futures: dict) -> None:
        """Workers that joined are offered work; the tasks of workers that left are cancelled and go back
        to the dispatcher's queue (a lost worker is not a compile failure; the key's lease expires)."""
        try:
            workers = dict(client.scheduler_info(n_workers=-1)["workers"])
        except Exception:
            return
        self._sync_workers(dispatch, workers)
        for addr in [a for a in dispatch.workers if a not in workers]:
            back = set(dispatch.lose_worker(addr))
            if back:
                self.log.warning("worker lost, its compiles go back to the queue", worker=addr, targets=sorted(back))
                client.cancel([f for f, t in futures.items() if t.id in back], force=True)

    def _retry_bigger(self, dispatch: Any, t: Target, out: Outcome) -> bool:
        """True when ``out`` is an out-of-memory kill the dispatcher retries on a worker with more memory."""
        from neuron_build.build.attempt import OUT_OF_MEMORY

        if out.ok or not str(out.reason).startswith(OUT_OF_MEMORY):
            return False
        fail = self.ws.store.failure(t.id)
        why = dispatch.out_of_memory(t.id, fail.peak_rss_bytes if fail is not None else None)
        if why is None:
            self.log.warning("out of memory, retried on a worker with more memory", target=t.id)
            return True
        return False

    def _running(self, client: Any, by_key: dict, started: dict[str, float]) -> dict[str, str]:
        """target id -> worker address of the tasks executing on a worker now (asked of every worker)."""
        try:
            executing = client.run(executing_keys)
        except Exception:
            return {}
        running: dict[str, str] = {}
        for w, keys in executing.items():
            for k in keys:
                t = by_key.get(k)
                if t is not None and t.id not in self.outcomes:
                    running[t.id] = w
                    started.setdefault(t.id, time.monotonic())
        return running

    def _collect(self, fut: Any, t: Target) -> Outcome:
        """The Outcome of a finished future (a failed task becomes a failed Outcome with its reason)."""
        key = self.ws.key(t).key
        try:
            d = fut.result()
        except TransientCompileError as e:
            d = e.outcome
            d["reason"] = f"{d.get('reason')} (tried {1 + self.ws.project.config.build.transient_retries} times)"
        except Exception as e:  # KilledWorker (its workers kept dying), an error outside the build
            name = type(e).__name__
            status = Status.KILLED if name == "KilledWorker" else Status.ERROR
            d = {"target": t.id, "key": key, "status": str(status), "reason": f"Dask task failed: {name}: {e}"[:500],
                 "compiled": False, "metrics": {}, "worker": None}
        if d.get("worker"):
            self.workers[t.id] = d["worker"]
        out = _as_outcome(d)
        ev = self.log.info if out.ok else self.log.error
        ev("built" if out.status == Status.PASS else str(out.status), target=t.id, worker=d.get("worker"),
           reason=out.reason or None)
        return out


__all__ = [
    "MEMORY_RESOURCE",
    "DaskBuild",
    "StoreSpec",
    "TransientCompileError",
    "check_workers",
    "compile_task",
    "connect",
    "executing_keys",
    "memory_bound",
    "open_spec",
    "probe_store",
    "scheduler_address",
    "shared_store_spec",
]
