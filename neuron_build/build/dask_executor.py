"""The Dask executor: one task per target on a Dask distributed cluster, each publishing straight into the
shared store.

``[build] executor = "dask"`` (or ``neuron-build build --executor dask``) with ``scheduler =
"tcp://host:8786"`` (or ``--scheduler``, or Dask's ``DASK_SCHEDULER_ADDRESS``). The client (:class:`DaskBuild`)
plans as a local build does, refuses to start unless every worker sees the same store, and submits one
``Client.submit(compile_task, ..., pure=False)`` per target as the dispatcher releases it, collected with
``distributed.as_completed``. On the worker, :func:`compile_task` opens the store from its location, loads
the project from the same config path (each worker host needs the checkout at that path: a shared mount or
the same clone), checks it computes the same key, and runs the same :class:`~neuron_build.build.builder.Builder`
as a local build: the key's store lock (so two clients never compile one key twice), the worker subprocess
(:class:`~neuron_build.build.local.LocalExecutor`: timeout, peak memory, failure classes), staging, seal,
publish, failure records. The manifest records ``executor = "dask"`` and the worker's address.

Scheduling: the client holds the queue (:class:`~neuron_build.build.dispatch.Dispatcher`, predictions from
:mod:`neuron_build.build.predict`): as slots free it releases the ready target with the longest predicted
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

import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import Outcome, as_status
from neuron_build.build.peaks import expected_peak
from neuron_build.build.predict import dispatch_jobs, target_predictions
from neuron_build.build.progress import BuildProgress, estimate_eta, pace, progress_line
from neuron_build.errors import UserError
from neuron_build.log import get_logger
from neuron_build.project.matrix import Target
from neuron_build.status import BuildResult, Status
from neuron_build.store.budget import GB

#: Seconds the client waits for the scheduler to answer, and for a first worker to join.
CONNECT_TIMEOUT_S = 10.0
#: Seconds between the client's looks at the cluster (finished tasks, who runs what).
POLL_S = 0.5
#: The Dask resource a compile host advertises (``--resources "memory_gb=N"``), GB.
MEMORY_RESOURCE = "memory_gb"
#: The memory the dispatcher gives a worker that advertises no bound, bytes.
UNBOUNDED = 2**62


# -- where the workers publish ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreSpec:
    """How a Dask worker opens the shared store: its location (a folder every worker mounts at this path,
    or a remote URL) and the storage options passed to :func:`neuron_build.store.open_store`."""

    location: str
    options: dict[str, Any] = field(default_factory=dict)


def shared_store_spec(project: Any) -> StoreSpec:
    """The store Dask workers publish into: ``[build] remote`` with its ``remote_options`` when the project
    has a remote store, else ``[build] store`` (an absolute folder path)."""
    remote = project.remote_url()
    if remote:
        return StoreSpec(str(remote), dict(project.config.build.remote_options or {}))
    return StoreSpec(project.store_url(), {})


def open_spec(spec: StoreSpec):
    """The store of ``spec`` (through :func:`neuron_build.store.open_store`)."""
    from neuron_build.store import open_store
    return open_store(spec.location, options=spec.options or None)


def probe_store(location: str, options: dict[str, Any], expected_id: str) -> str | None:
    """Run on a worker: None when the store at ``location`` is the client's (its ``store-id.json`` holds
    ``expected_id``), else the one-clause reason it is not."""
    from neuron_build.store.identity import store_id
    try:
        found = store_id(open_spec(StoreSpec(location, options)), create=False)
    except Exception as e:  # unreachable, unreadable, not a store: all mean "cannot use it"
        return f"cannot open it there ({type(e).__name__}: {e})"
    if found is None:
        return "that location holds no store-id.json there: it is another folder than the client's"
    if found != expected_id:
        return f"the store there has id {found}, the client's has {expected_id}: it is another store"
    return None


# -- connecting -------------------------------------------------------------------------------------------
def scheduler_address(cli: str | None, configured: str | None, config_file: Any = "buckets.toml") -> str:
    """The scheduler to use: ``--scheduler``, else ``[build] scheduler``, else ``DASK_SCHEDULER_ADDRESS``.

    Raises:
        UserError: none of them is set.
    """
    addr = cli or configured or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if not addr:
        raise UserError(f"{config_file}: executor dask needs a scheduler: set scheduler = \"tcp://HOST:8786\" under "
                        f"[build], pass --scheduler ADDR, or set DASK_SCHEDULER_ADDRESS (or build here with "
                        f"--executor local)")
    return addr


def _close_half_made(error: BaseException, client_cls: type) -> None:
    """Close the ``distributed.Client`` whose constructor raised ``error`` (found in the traceback's frames) now,
    while its event loop still runs: left to ``Client.__del__`` at interpreter exit, its close waits for a
    loop that is gone and prints ``Exception ignored in: Client.__del__ ... TimeoutError`` about 20 s later."""
    import contextlib

    tb = error.__traceback__
    while tb is not None:
        made = tb.tb_frame.f_locals.get("self")
        if isinstance(made, client_cls):
            with contextlib.suppress(Exception):
                made.close(timeout=2)
            made.status = "closed"  # so that __del__ has nothing left to close
            return
        tb = tb.tb_next


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S):
    """A ``distributed.Client`` of the scheduler at ``address``.

    Raises:
        UserError: the scheduler did not answer within ``timeout_s`` seconds (one line, with the fix).
    """
    from distributed import Client
    try:
        return Client(address, timeout=timeout_s, set_as_default=False)
    except Exception as e:  # OSError / TimeoutError / ValueError (a bad address), all "cannot reach"
        _close_half_made(e, Client)
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"cannot reach the Dask scheduler at {address} ({why[:200]}); start it (dask scheduler), fix "
                        f"[build] scheduler or --scheduler, or build on this host with --executor local") from None


def check_workers(client: Any, spec: StoreSpec, ident: str, address: str, wait_s: float = CONNECT_TIMEOUT_S) -> dict:
    """Wait for at least one worker, then check from every worker that the store is reachable and is the
    client's store. Returns the scheduler's worker table (address -> info with ``nthreads``, ``resources``).

    Raises:
        UserError: no worker joined within ``wait_s`` seconds, or a worker sees another store (or none) at
            the location; the message names the worker, the location and the fix.
    """
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except Exception:
        raise UserError(f"no Dask workers are connected to {address}; start some with "
                        f"`dask worker {address} --nthreads 1` (or build here with --executor local)") from None
    answers = client.run(probe_store, spec.location, spec.options, ident)
    bad = {w: why for w, why in sorted(answers.items()) if why is not None}
    if bad:
        w, why = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more workers)" if len(bad) > 1 else ""
        raise UserError(f"the store {spec.location} is not reachable as the same store from Dask worker {w}{more}: "
                        f"{why}; Dask workers publish straight into the store, so use a folder every worker mounts "
                        f"at that path or a remote store ([build] remote), or build here with --executor local")
    return dict(client.scheduler_info(n_workers=-1)["workers"])


# -- on the worker ----------------------------------------------------------------------------------------
class TransientCompileError(Exception):
    """A compile failed with the transient exit status 70 on a worker: raised so that Dask retries the task
    (``retries=``). ``outcome`` is the failed attempt's outcome as a dict (see :func:`outcome_dict`)."""

    def __init__(self, outcome: dict[str, Any]):
        super().__init__(f"{outcome.get('target')}: TRANSIENT: {outcome.get('reason')}")
        self.outcome = outcome

    def __reduce__(self):
        return (TransientCompileError, (self.outcome,))


_builders: dict[tuple, Any] = {}
_builders_lock = threading.Lock()


def _builder_for(job: dict[str, Any], worker: Any):
    """The worker process's Builder for one client build (made on first use; the last few are kept)."""
    from neuron_build.build.builder import Builder
    from neuron_build.build.local import LocalExecutor
    from neuron_build.project.config import load_project

    ident = (job["build_id"], job["config"], job["backend"], job["store"]["location"])
    with _builders_lock:
        b = _builders.get(ident)
        if b is None:
            project = load_project(job["config"])
            cfg = project.config.build
            store = open_spec(StoreSpec(**job["store"]))
            limit, limit_of = worker_memory_limit(worker)
            executor = LocalExecutor(cfg.timeout_s, cfg.heartbeat_s, should_stop=lambda: task_cancelled(worker),
                                     memory_limit_bytes=limit, memory_limit_of=limit_of)
            b = Builder(project, backend=job["backend"], executor=executor, store=store, host_memory=False,
                        transient_retries=0, provenance={"executor": "dask", "worker": worker.address,
                                                         "scheduler": job.get("scheduler")})
            while len(_builders) >= 4:
                _builders.pop(next(iter(_builders)))
            _builders[ident] = b
    return b


def memory_bound(memory_limit: Any, resources: dict | None) -> int | None:
    """The memory a compile on a worker may use, bytes: the smaller of its ``--memory-limit`` (bytes; 0 or
    None: none) and its :data:`MEMORY_RESOURCE` resource (GB = 1e9 bytes); None when it has neither."""
    figures = []
    if isinstance(memory_limit, (int, float)) and memory_limit > 0:
        figures.append(int(memory_limit))
    gb = (resources or {}).get(MEMORY_RESOURCE)
    if isinstance(gb, (int, float)) and gb > 0:
        figures.append(int(gb * GB))
    return min(figures) if figures else None


def worker_memory_limit(worker: Any) -> tuple[int | None, str]:
    """(bytes, whose bound) a compile subprocess on this Dask worker is held to: see :func:`memory_bound`.
    The compile runs outside the worker's own memory accounting (Dask watches the worker process only), so
    the executor enforces it on the subprocess's tree."""
    try:
        ml = worker.memory_manager.memory_limit
    except AttributeError:
        ml = getattr(worker, "memory_limit", None)
    res = dict(getattr(worker.state, "total_resources", None) or {})
    bound = memory_bound(ml, res)
    if bound is None:
        return None, ""
    which = "--memory-limit" if isinstance(ml, (int, float)) and ml > 0 and int(ml) == bound else MEMORY_RESOURCE
    return bound, f"the memory limit of Dask worker {worker.address} ({which})"


def task_cancelled(worker: Any) -> bool:
    """Called in a task's thread on a Dask worker: has the scheduler cancelled or released the task?"""
    try:
        key = worker.get_current_task()
        ts = worker.state.tasks.get(key)
    except Exception:
        return False
    return ts is None or ts.state in ("cancelled", "released", "forgotten")


def executing_keys(dask_worker: Any) -> list:
    """Run on a worker (``Client.run``): the keys of the tasks it is executing now."""
    return [ts.key for ts in list(dask_worker.state.executing)]


def outcome_dict(out: Outcome, worker: str) -> dict[str, Any]:
    """An Outcome as plain data for the trip back to the client, with the worker's address."""
    return {"target": out.target, "key": out.key, "status": str(out.status), "reason": out.reason,
            "compiled": out.compiled, "metrics": dict(out.metrics), "worker": worker}


def compile_task(job: dict[str, Any]) -> dict[str, Any]:
    """The Dask task of one target (runs on a worker): build it into the shared store as a local build would.

    Args:
        job: ``config`` (path of buckets.toml), ``target`` (id), ``key`` (what the client computed),
            ``backend`` (override or None), ``store`` (:class:`StoreSpec` fields), ``store_id`` (the
            client's store identity), ``retry_failed``, ``build_id``, ``scheduler``.

    Returns:
        :func:`outcome_dict` of the build (PASS, cached/reused, or a deterministic failure).

    Raises:
        TransientCompileError: the compile exited with status 70 (Dask retries the task).
    """
    from distributed import get_worker

    from neuron_build.build.local import CompileCancelled

    worker = get_worker()
    me = worker.address
    tid, key = job["target"], job["key"]

    def failed(reason: str) -> dict[str, Any]:
        return {"target": tid, "key": key, "status": str(Status.ERROR), "reason": reason, "compiled": False,
                "metrics": {}, "worker": me}

    why = probe_store(job["store"]["location"], job["store"]["options"], job["store_id"])
    if why is not None:
        return failed(f"the store {job['store']['location']} on Dask worker {me}: {why}")
    try:
        b = _builder_for(job, worker)
    except Exception as e:
        return failed(f"Dask worker {me} could not load the project {job['config']}: {type(e).__name__}: {e}"[:500])
    target = b.by_id.get(tid)
    if target is None:
        return failed(f"Dask worker {me}: {job['config']} there has no target {tid}: its checkout differs")
    mine = b.key(target).key
    if mine != key:
        return failed(f"Dask worker {me} computes key {mine[:12]} for {tid}, the client {key[:12]}: its checkout, "
                      f"environment or toolchain differs (neuron-build explain {tid} on both)")
    try:
        out = b.build(target, retry_failed=job["retry_failed"])
    except CompileCancelled as e:
        return {**failed(str(e)), "status": "CANCELLED"}
    res = outcome_dict(out, me)
    if out.status == Status.TRANSIENT:
        raise TransientCompileError(res)
    return res


# -- on the client ----------------------------------------------------------------------------------------
def _as_outcome(d: dict[str, Any]) -> Outcome:
    status = BuildResult.CACHED if d["status"] == BuildResult.CACHED else as_status(d["status"])
    return Outcome(d["target"], d["key"], status, d.get("reason", ""), compiled=bool(d.get("compiled")),
                   metrics=dict(d.get("metrics") or {}))


class DaskBuild:
    """Builds targets of one project on a Dask cluster (the client side).

    Args:
        builder: the client's :class:`~neuron_build.build.builder.Builder` (plans, keys, the store it reads).
        address: the scheduler (``tcp://host:8786``), or a function that starts a cluster and returns its
            scheduler's address (called only when something is left to compile).
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

    def __init__(self, builder: Any, address: str | Callable[[], str], retry_failed: bool = True,
                 report: Callable[[str], None] | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 display: Callable[[int, int, dict], Any] | None = None):
        self.b = builder
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

        Raises:
            UserError: the scheduler is unreachable, no worker joined, or the workers cannot reach the store.
            KeyboardInterrupt: after cancelling every task (their compiles are killed on the workers).
        """
        from neuron_build.store.identity import store_id

        b = self.b
        spec = shared_store_spec(b.project)
        todo = []
        for t in targets:
            if b.store.repair(b.key(t).key).hit:
                self.outcomes[t.id] = Outcome(t.id, b.key(t).key, BuildResult.CACHED)
            else:
                todo.append(t)
        if not todo:
            return self.outcomes
        if callable(self.address):  # a cluster started for this build (clusters.started_cluster): only now
            self.address = self.address()
        client = connect(self.address, self.connect_timeout_s)
        try:
            try:
                ident = store_id(open_spec(spec))
            except (OSError, ValueError) as e:
                raise UserError(f"cannot read or write the identity of the store {spec.location} ({e}); the Dask "
                                f"executor needs a store it can write, or build here with --executor local") from None
            workers = check_workers(client, spec, ident, self.address, self.connect_timeout_s)
            self._submit_and_collect(client, todo, spec, ident, workers)
        finally:
            client.close()
        return self.outcomes

    def _job(self, t: Target, spec: StoreSpec, ident: str, build_id: str) -> dict[str, Any]:
        b = self.b
        return {"config": str(Path(b.project.path).resolve()), "target": t.id, "key": b.key(t).key,
                "backend": b.keys.backend, "store": {"location": spec.location, "options": spec.options}, "store_id": ident,
                "retry_failed": self.retry_failed, "build_id": build_id, "scheduler": self.address}

    def _too_big(self, t: Target, largest: int) -> str | None:
        """Why ``t`` is not submitted: its current key's last compile ran out of memory on a worker whose
        bound was at least ``largest`` (the largest bound of the workers now, bytes; 0: none bounded), so
        it would again. None when it may be submitted."""
        from neuron_build.build.attempt import OUT_OF_MEMORY

        fail = self.b.store.failure(t.id)
        if (fail is None or fail.key != self.b.key(t).key or not str(fail.reason).startswith(OUT_OF_MEMORY)
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
        cfg = self.b.project.config.build
        peak = expected_peak(self.b.store, t.model, t.bucket_id, int(cfg.default_compile_memory_gb * GB))
        want = round(peak.bytes / GB, 3)
        if want > max(mems):
            self.log.warning("expected peak above every worker's memory_gb", target=t.id, expected_gb=want,
                             largest_gb=max(mems))
            want = max(mems)
        return {MEMORY_RESOURCE: want}

    def _submit_and_collect(self, client: Any, todo: list[Target], spec: StoreSpec, ident: str, workers: dict) -> None:
        from distributed import as_completed

        from neuron_build.build.dispatch import Dispatcher

        b = self.b
        build_id = secrets.token_hex(4)
        retries = b.project.config.build.transient_retries
        futures: dict[Any, Target] = {}
        todo = self._drop_too_big(todo, workers)
        predicted = target_predictions(b, todo)
        jobs = dispatch_jobs(todo, predicted, b.project.config.build.default_compile_memory_gb)
        self._cap_at_largest(jobs, workers)
        dispatch = Dispatcher(jobs)
        self._sync_workers(dispatch, workers)
        by_id = {t.id: t for t in todo}
        tries: dict[str, int] = {}
        advertised = any(MEMORY_RESOURCE in (w.get("resources") or {}) for w in workers.values())

        def submit_ready() -> None:
            for tid, addr in dispatch.assign(time.monotonic()):
                t = by_id[tid]
                tries[tid] = tries.get(tid, 0) + 1
                kw: dict[str, Any] = {"workers": [addr], "allow_other_workers": False,
                                      "priority": dispatch.priority(tid)}
                if advertised:  # within Dask's own accounting too: the p50 the dispatcher reserved
                    p50 = dispatch.jobs[tid].memory_p50 or dispatch.jobs[tid].memory
                    kw["resources"] = {MEMORY_RESOURCE: round(min(p50, dispatch.workers[addr].memory) / GB, 3)}
                fut = client.submit(compile_task, self._job(t, spec, ident, build_id), pure=False, retries=retries,
                                    key=f"neuron-build-{t.id}-{b.key(t).key[:12]}-{build_id}-{tries[tid]}", **kw)
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
                    if display is not None:
                        if t.id not in shown:
                            display.started(t.id, where=self.workers.get(t.id))
                        display.finished(out)
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
            left = [f for f in futures if not f.done()]
            self.log.warning("cancelling", tasks=len(left))
            if left:
                client.cancel(left, force=True)  # returns once the scheduler took it; workers kill the compiles
            raise
        finally:
            if display is not None:
                display.stop()

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
            self.outcomes[t.id] = Outcome(t.id, self.b.key(t).key, Status.KILLED, why)  # not retried on that size
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
                self.outcomes[tid] = Outcome(tid, self.b.key(by_id[tid]).key, Status.KILLED, why)
                self.log.error(str(Status.KILLED), target=tid, reason=why)
                if self.report is not None:
                    self.report(f"  FAILED {tid}: KILLED: {why}")
                n += 1
        return n

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
        fail = self.b.store.failure(t.id)
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
        key = self.b.key(t).key
        try:
            d = fut.result()
        except TransientCompileError as e:
            d = e.outcome
            d["reason"] = f"{d.get('reason')} (tried {1 + self.b.project.config.build.transient_retries} times)"
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
    "task_cancelled",
    "worker_memory_limit",
]
