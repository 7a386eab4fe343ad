"""What runs on a Dask worker for the Dask executor (:mod:`neuron_build.build.fleet.dask_executor`, the client side):
the store the workers publish into (:class:`StoreSpec`, :func:`probe_store`), the task of one target
(:func:`compile_task`, with :class:`TransientCompileError` for Dask's retries), and the worker's memory bound
and cancellation, which the compile subprocess is held to.

:func:`compile_task` opens the store from its location, loads the project from the same config path, checks it
computes the client's key, and runs the same :class:`~neuron_build.build.builder.Builder` as a local build.
Functions here run in the worker process (submitted with ``Client.submit`` or ``Client.run``), so they are
pickled by reference to this module: every worker host imports the same neuron_build.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from neuron_build.build.attempt import Outcome
from neuron_build.errors import NeuronBuildError
from neuron_build.status import Status
from neuron_build.store.budget import GB

#: The Dask resource a compile host advertises (``--resources "memory_gb=N"``), GB.
MEMORY_RESOURCE = "memory_gb"


# -- where the workers publish ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreSpec:
    """How a Dask worker opens the shared store: its location (a folder every worker mounts at this path,
    or a remote URL) and the storage options passed to :func:`neuron_build.store.open_store`."""

    location: str
    options: dict[str, Any] = field(default_factory=dict)


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


# -- on the worker ----------------------------------------------------------------------------------------
class TransientCompileError(NeuronBuildError):
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
    from neuron_build.workspace import Workspace

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
            ws = Workspace(project, store=store, backend=job["backend"])
            b = Builder(ws, executor=executor, host_memory=False, transient_retries=0,
                        provenance={"executor": "dask", "worker": worker.address, "scheduler": job.get("scheduler")})
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
            "compiled": out.compiled, "metrics": dict(out.metrics), "worker": worker,
            "rechecked": list(out.rechecked)}


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
    target = b.ws.by_id.get(tid)
    if target is None:
        return failed(f"Dask worker {me}: {job['config']} there has no target {tid}: its checkout differs")
    mine = b.ws.key(target).key
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


__all__ = [
    "MEMORY_RESOURCE",
    "StoreSpec",
    "TransientCompileError",
    "compile_task",
    "executing_keys",
    "memory_bound",
    "open_spec",
    "outcome_dict",
    "probe_store",
    "task_cancelled",
    "worker_memory_limit",
]
