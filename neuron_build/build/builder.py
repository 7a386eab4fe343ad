"""One target: key -> lookup -> compile (through an executor) -> publish.

Domain code: no doit here (see :mod:`neuron_build.tasks`) and no torch (the compile runs in
``python -m neuron_build.worker``, started by the :class:`~neuron_build.build.executor.Executor`).

The layers: :class:`~neuron_build.workspace.Workspace` (the opened project: keys, state, what changed; read
commands open one and never a Builder), :func:`~neuron_build.build.executor.compile_request` (the worker
request of a target),
:class:`~neuron_build.build.executor.Executor` (runs one compile: :class:`~neuron_build.build.local.LocalExecutor`
by default), :mod:`neuron_build.build.attempt` (what a run means, the full-disk failures),
:mod:`neuron_build.build.graph.reuse` (the graph key: ask, gate, index, publish over the same graph's blobs),
:mod:`neuron_build.build.manifests` (the one manifest builder; each staged file hashed once),
:mod:`neuron_build.build.recorder` (target records, failure records, the ledger, kept failure workdirs) and the
:class:`Builder` here, which holds the key's lock and the memory reservation, retries transient failures and
publishes artifacts.
"""

from __future__ import annotations

import errno
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import (
    BuildContext,
    Classification,
    DiskFull,
    Outcome,
    as_status,
    classify,
    disk_full,
    free_space,
)
from neuron_build.build.executor import NOT_RUN, WORKER_LOG, CompileRun, Executor, compile_request
from neuron_build.build.graph import probe as graph_probe
from neuron_build.build.graph.probe import ProbeHit
from neuron_build.build.graph.relink import RELINKED
from neuron_build.build.graph.reuse import GraphHit, GraphReuse, Reused
from neuron_build.build.jobs import default_jobs
from neuron_build.build.local import LocalExecutor
from neuron_build.build.manifests import artifact_manifest, hash_files
from neuron_build.build.peaks import expected_peak
from neuron_build.build.recorder import Recorder, Unrecorded
from neuron_build.build.summary import why_rechecked
from neuron_build.compilers import graph_key
from neuron_build.compilers.base import CompileRequest
from neuron_build.log import get_logger
from neuron_build.project.matrix import Target
from neuron_build.project.toolchain import announce_backend, neuron_status
from neuron_build.status import DOWNLOADED, BuildResult, Status
from neuron_build.store.budget import GB
from neuron_build.store.contract import ArtifactStore
from neuron_build.workspace import Workspace


class Builder:
    """Builds one target at a time of an opened project into its store: the key's lock, the attempts, the
    publish.

    Args:
        ws: the opened project (:class:`~neuron_build.workspace.Workspace`): its keys, targets and the store
            to build into (a Dask worker opens one over the shared store it opened from the client's location).
        executor: runs each compile; default a :class:`~neuron_build.build.local.LocalExecutor` with the
            project's ``[build] timeout_s`` and ``heartbeat_s``.
        host_memory: reserve each compile's expected peak in the host-memory budget (``[build]
            max_host_memory_gb``); False where something else bounds memory (Dask resources).
        transient_retries: override ``[build] transient_retries`` (a Dask worker passes 0: Dask retries).
        provenance: extra fields recorded in every manifest this builder writes, e.g. ``{"executor":
            "dask", "worker": "tcp://10.0.0.5:40123"}`` (informational, never in the key).

    Attributes:
        ws: the workspace it builds from: its project, the store it locks and publishes into and the keys of
            its manifests (callers ask it for targets, keys and states, never the Builder).
    """

    def __init__(self, ws: Workspace, executor: Executor | None = None, host_memory: bool = True,
                 transient_retries: int | None = None, provenance: dict[str, Any] | None = None):
        self.ws = ws
        project = ws.project
        #: this build's id (random, once per Builder: its threads and the runner processes doit forks share
        #: it): graph probe results are stamped with it and used by this build only (build.graph_probe)
        self.build_id = uuid.uuid4().hex
        cfg = project.config.build
        mem = cfg.max_host_memory_gb if host_memory else None
        self.memory = self.ws.store.memory_budget(int(mem * GB) if mem is not None else None,
                                                  heartbeat_s=cfg.heartbeat_s)
        self.executor: Executor = executor if executor is not None else LocalExecutor(cfg.timeout_s, cfg.heartbeat_s)
        self.transient_retries = cfg.transient_retries if transient_retries is None else transient_retries
        self.provenance = {"executor": "local", **(provenance or {})}
        self._toolchain_problem: str | None | bool = False  # False: not checked yet
        self.graph = GraphReuse(project, self.ws.store, self.provenance)
        self.recorder = Recorder(self.ws.store, self.ws.keys.backend, project.config.monitoring,
                                 lambda: getattr(self.executor, "name", type(self.executor).__name__))

    def announce_backend(self) -> None:
        """Log the ``auto`` fallback note ("backend auto: using inductor because ..."), once per process.
        Builds call it; read commands (plan, ls, show, ...) do not."""
        announce_backend(self.ws.keys.backend_note)

    def default_jobs(self) -> int:
        """Compiles to run at once when ``-n`` is not given: one per CPU, bounded by ``[build]
        max_host_memory_gb`` (else 80 % of physical memory) over ``default_compile_memory_gb`` (see
        :func:`neuron_build.build.jobs.default_jobs`)."""
        cfg = self.ws.project.config.build
        mem = cfg.max_host_memory_gb
        return default_jobs(int(mem * GB) if mem is not None else None, int(cfg.default_compile_memory_gb * GB))

    def toolchain_problem(self) -> str | None:
        """For the neuron and torchneuron backends: the one-sentence reason the toolchain is unusable (from package
        metadata, checked once per Builder), else None. Such targets fail as TOOLCHAIN_MISSING without
        starting a worker."""
        if self._toolchain_problem is False:
            self._toolchain_problem = None
            if self.ws.keys.backend_spec is not None and self.ws.keys.backend_spec.neuron_toolchain:
                st = neuron_status()
                self._toolchain_problem = None if st.usable else st.problem
        return self._toolchain_problem  # type: ignore[return-value]

    # -- the shared store ---------------------------------------------------------------------
    def push_failure(self, key: str) -> str | None:
        """Why ``key``'s artifact, built in this process, is not on the remote store (one line with the
        fix), or None (pushed, or no remote)."""
        for k, reason in self.ws.store.push_failures:
            if k == key:
                return (f"its push to {self.ws.store.remote_location} failed: {reason}; it stays in the local "
                        "store and the next build (or `neuron-build push`) pushes it")
        return None

    def push_pending(self) -> list[str]:
        """Push what earlier builds on this host could not push. Returns one line per artifact that still
        failed (empty when everything is on the remote, or there is no remote)."""
        failed = self.ws.store.push_pending()
        return [f"{key[:16]}: push to {self.ws.store.remote_location} failed again: {reason}"
                for key, reason in failed]

    # -- building ----------------------------------------------------------------------------
    def build(self, target: Target, retry_failed: bool = True, no_retry_option: str = "--no-retry-failed") -> Outcome:
        """Build one target unless the store already holds its artifact.

        The compile runs under the key's cross-process lock (:class:`~neuron_build.store.locks.KeyLock`): a
        second builder of the same key waits, then reuses the first one's artifact. Before it starts, the
        compile reserves its expected peak memory in the host's budget (``[build] max_host_memory_gb``).

        Never raises for a compile failure (a full disk included): the failure is recorded under the
        target and returned. Transient failures (exit status 70) are retried up to ``[build]
        transient_retries`` times. With ``retry_failed`` False, a target whose current key failed last
        time is not compiled again (its recorded failure is returned, its reason naming
        ``no_retry_option``, the option that asked for that: ``retry_failed=0`` under doit).
        """
        ki = self.ws.key(target)
        ctx = BuildContext(target, ki, get_logger(target=target.id, key=ki.key[:12]))
        found = self.ws.store.repair(ki.key)
        ctx = self._check_recorded(ctx, found)
        if found.hit and not ctx.stale:
            self.recorder.remember(ctx, Status.PASS)
            if found.location == "remote":
                ctx.log.info("downloaded", remote=self.ws.store.remote_location)
                self.recorder.ledger(ctx, "downloaded", Status.PASS, manifest=found.manifest)
                return Outcome(target.id, ki.key, BuildResult.CACHED, DOWNLOADED)
            self.recorder.ledger(ctx, "cached", Status.PASS, manifest=found.manifest)
            ctx.log.debug("cached")
            return Outcome(target.id, ki.key, BuildResult.CACHED)
        if not retry_failed:
            fail = self.ws.store.failure(target.id)
            if fail and fail.key == ki.key:
                ctx.log.info("not retried: failed last time", status=fail.status)
                return Outcome(target.id, ki.key, as_status(fail.status),
                               f"not retried ({no_retry_option}); failed last time: {fail.reason}")
        cfg = self.ws.project.config.build
        if self.ws.store.read_only:
            return self._read_only(ctx)
        lock = self.ws.store.key_lock(ki.key, target=target.id, heartbeat_s=cfg.heartbeat_s)
        try:
            with disk_full("taking the key's lock", lock.path, prefer_filename=False):
                lock.acquire()
        except DiskFull as e:
            ctx.log.error("compile failed", status=Status.ERROR, reason=str(e))
            return Outcome(target.id, ki.key, Status.ERROR, str(e))
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            return self._read_only(ctx, e)
        with lock:
            found = self.ws.store.repair(ki.key)
            ctx = self._check_recorded(ctx, found)
            if found.hit and not ctx.stale:
                self.recorder.remember(ctx, Status.PASS)
                self.recorder.ledger(ctx, "reused", Status.PASS, manifest=found.manifest)
                who = lock.waited_for or {}
                by = f"pid {who['pid']} on {who.get('host')}" if who.get("pid") else "another builder"
                ctx.log.info("reused", built_by=by, waited_s=round(lock.waited_s, 1))
                return Outcome(target.id, ki.key, BuildResult.CACHED,
                               f"reused: built by {by} while this builder waited {lock.waited_s:.1f} s")
            peak = expected_peak(self.ws.store, target.model, target.bucket_id, int(cfg.default_compile_memory_gb * GB))
            with self.memory.reserve(peak.bytes, target.id, ctx.log, peak.source):
                out = self._build_locked(ctx)
            if ctx.stale:  # the summary says why (summary.why_rechecked: versions of changed distributions)
                out = replace(out, rechecked=why_rechecked(ctx.stale, found.manifest.recorded_inputs,
                                                           self.ws.keys.checker().dist))
            return out

    def _check_recorded(self, ctx: BuildContext, found: Any) -> BuildContext:
        """``ctx`` with :attr:`BuildContext.stale` set from the found artifact's recorded inputs (the files,
        variables and distributions its build recorded: a hit needs all of them unchanged); each changed
        one is logged."""
        if not found.hit:
            return replace(ctx, stale=())
        stale = tuple(self.ws.keys.rebuild_reasons(ctx.target.model, found.manifest.recorded_inputs))
        if stale and stale != ctx.stale:
            ctx.log.info("stale: compiling", why="; ".join(stale[:5]))
        return replace(ctx, stale=stale)

    def _recorded_inputs(self, ctx: BuildContext, imported: Sequence[str], reads: Any) -> dict[str, Any]:
        """The manifest's ``recorded_inputs`` of what the worker (or the probe) recorded (its ``imported`` and
        ``reads``), each file by its content now. Marked ``incomplete`` (never a hit), with a one-line warning,
        when a file's content now is not what the worker read (its ``reads.digests``: it changed while the
        target compiled), when the worker could not record every read, or when the model is ``always_rebuild``."""
        from neuron_build.project import declared

        out = self.ws.keys.recorded_inputs(ctx.target.model, list(imported), reads)
        model = ctx.target.model
        changed = declared.changed_since_read(out.get("files") or {},
                                              reads.get("digests") if isinstance(reads, dict) else None,
                                              self.ws.project.root.resolve())
        if changed:
            out["incomplete"] = f"{changed[0]} {declared.CHANGED_WHILE}"
            ctx.log.warning(f"{changed[0]} {declared.CHANGED_WHILE}: this artifact is rebuilt by the next build")
        elif out.get("incomplete"):
            why = str(out["incomplete"])
            ctx.log.warning(f"{declared.INCOMPLETE} ({why}): this artifact is rebuilt by every build"
                            + ("" if "always_rebuild" in why else f"; {declared.fix(model)}"))
        if self.ws.project.config.models[model].always_rebuild:
            out["incomplete"] = f"{declared.ALWAYS_REBUILD} in [models.{model}]"
        return out

    def _read_only(self, ctx: BuildContext, error: OSError | None = None) -> Outcome:
        """The outcome of a target that must be compiled into a store this process may not write (opened
        read-only, a read-only mount, no write permission): one line, nothing compiled."""
        why = f" ({error.strerror}: {error.filename})" if error is not None and error.filename else ""
        reason = (f"store {self.ws.store.location} is read-only{why}: cannot compile {ctx.target.id} into it; "
                  f"make it writable, or set [build] store (buckets.toml) to a folder this user may write")
        ctx.log.error("compile failed", status=Status.ERROR, reason=reason)
        return Outcome(ctx.target.id, ctx.ki.key, Status.ERROR, reason)

    def _build_locked(self, ctx: BuildContext) -> Outcome:
        """Compile (holding the key's lock), retrying transient failures. What changed since the target's
        last build is taken before the first attempt (for the ledger)."""
        retries = self.transient_retries
        ctx = replace(ctx, changed=tuple(self.ws.changed(ctx.target)[0]))
        while True:
            ctx = replace(ctx, attempt=ctx.attempt + 1)
            out = self._compile(ctx)
            if out.status != Status.TRANSIENT or ctx.attempt > retries:
                return out
            ctx.log.warning("transient compiler failure, retrying", attempt=ctx.attempt, retries=retries)

    def _compile(self, ctx: BuildContext) -> Outcome:
        """One attempt: stage, run the executor, publish or record the failure, clean the staging folder."""
        problem = self.toolchain_problem()
        if problem:
            return self.recorder.toolchain_missing(ctx, problem)
        staging: Path | None = None
        try:
            # no room even to start the compile (staging folder, request, log)
            with disk_full("preparing the compile", lambda: staging or self.ws.store.location):
                staging = self.ws.store.new_staging(ctx.ki.key)
                obj, work = staging / "object", staging / "work"
                obj.mkdir()
                work.mkdir()
                req = compile_request(self.ws, ctx.target, ctx.ki, obj, work)
                self.graph.ask(ctx, req, work)
                restore_cache(self.ws.store, ctx, req, work)
                ctx.log.info("compiling", backend=req.backend, hardware_target=req.hardware_target,
                             attempt=ctx.attempt)
                with self.graph.gate(ctx, req, work):  # the graph key's lock, held until it is indexed
                    # one probe per model build answers "graph unchanged" without a worker per target
                    run = graph_probe.probe_hit(self.ws, self.build_id, ctx, req) or self.executor.run(req, work, ctx.log)
                    done = self._finish(ctx, req, run, obj)
                    if done is None:  # the graph index entry was stale: compile after all
                        shutil.rmtree(obj, ignore_errors=True)
                        obj.mkdir()
                        req.options[graph_key.OPTION]["no_reuse"] = True
                        run = self.executor.run(req, work, ctx.log)
                        done = self._finish(ctx, req, run, obj)
        except DiskFull as e:
            done = self.recorder.failure(ctx, Classification(Status.ERROR, str(e)), NOT_RUN)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        if isinstance(done, Unrecorded):  # the disk was full: try again now that the staging files are gone
            return self.recorder.late_failure(ctx, done)
        return done

    def _finish(self, ctx: BuildContext, req: CompileRequest, got: CompileRun | ProbeHit,
                obj: Path) -> Outcome | Unrecorded | None:
        """Publish the artifact of the same graph when ``got`` is a graph hit (the probe's
        :class:`~neuron_build.build.graph.probe.ProbeHit`, or a worker's run that found its graph key in the
        index: :meth:`~neuron_build.build.graph.reuse.GraphHit.of_run`), else classify the worker's run and
        publish its artifact (PASS) or record the failure. None: the index entry the hit names is stale (its
        artifact is gone): the caller compiles."""
        if isinstance(got, ProbeHit):  # the probe found the graph in the index: no compile worker ran
            hit, verdict = got, Classification(Status.PASS, "")
            # the probe's process, as a full disk's failure record takes it (no result: never classified)
            run = CompileRun(exit_code=got.exit_code, wall_s=got.seconds, peak_rss_bytes=got.peak_rss_bytes,
                             timed_out=False, log=got.log)
        else:
            run, verdict = got, classify(got, self.ws.project.config.build.timeout_s, free_space(obj), obj.parent)
            hit = GraphHit.of_run(got)
        if verdict.status == Status.PASS:
            try:
                if hit is not None:
                    reused = self.graph.reuse(ctx, req, hit, obj, self._recorded_inputs(ctx, hit.imported, hit.reads))
                    return None if reused is None else self._adopt(ctx, hit, reused)
                return self._publish(ctx, req, run, obj)
            except DiskFull as e:
                verdict = Classification(Status.ERROR, str(e))
        return self.recorder.failure(replace(ctx, work=obj.parent / "work"), verdict, run)

    def _publish(self, ctx: BuildContext, req: CompileRequest, run: CompileRun, obj: Path) -> Outcome:
        """Write the worker log and the manifest (last, fsynced) into the staging object and publish it.

        Raises:
            DiskFull: the file system filled up; nothing was published.
        """
        metrics = {"status": Status.PASS, "compile_time_s": round(run.wall_s, 3), "peak_rss_bytes": run.peak_rss_bytes,
                   "exit_code": run.exit_code, "attempts": ctx.attempt}
        with disk_full("writing the artifact", obj):
            (obj / WORKER_LOG).write_bytes(run.log)
        with disk_full("writing the manifest", obj):
            self._seal(ctx, req, run, obj, metrics)
        with disk_full("publishing", obj):
            self.ws.store.publish(obj, ctx.ki.key, replace=bool(ctx.stale))
        self.ws.store.clear_failure(ctx.target.id)
        self.recorder.remember(ctx, Status.PASS)
        self.graph.index(ctx, req, (run.result or {}).get("graph_key"), (run.result or {}).get("graph_document"))
        remember_cache(self.ws.store, ctx, req)
        self.recorder.ledger(ctx, "compile", Status.PASS, run=run, metrics=metrics)
        ctx.log.info("built", compile_time_s=metrics["compile_time_s"], op_count=metrics["op_count"],
                     artifact_mb=round(metrics["artifact_bytes"] / 2**20, 2),
                     peak_rss_mb=round(run.peak_rss_bytes / 2**20))
        return Outcome(ctx.target.id, ctx.ki.key, Status.PASS, compiled=True, metrics=metrics)

    # -- the graph key (the second level: :mod:`neuron_build.build.graph.reuse`) ---------------------
    def _adopt(self, ctx: BuildContext, hit: GraphHit, reused: Reused) -> Outcome:
        """Record a graph reuse just published (the target record, the ledger) and return its outcome."""
        src, gk = reused.source, reused.graph_key
        self.ws.store.clear_failure(ctx.target.id)
        self.recorder.remember(ctx, Status.PASS)
        self.recorder.ledger(ctx, "graph-reused", Status.PASS, metrics=reused.metrics, reused_from=src, graph_key=gk)
        if reused.relinked:  # new weights with the stored compiled files (build/graph/relink.py)
            ctx.log.info("weights changed, graph unchanged", relinked=src[:12], graph_key=gk[:12])
            return Outcome(ctx.target.id, ctx.ki.key, Status.PASS, RELINKED.format(source=src), compiled=False,
                           metrics=reused.metrics)
        ctx.log.info("source changed, graph unchanged", reused=src[:12], graph_key=gk[:12],
                     seconds=round(hit.seconds, 1))
        return Outcome(ctx.target.id, ctx.ki.key, Status.PASS, f"graph unchanged: reused {src}",
                       compiled=False, metrics=reused.metrics)

    def _seal(self, ctx: BuildContext, req: CompileRequest, run: CompileRun, obj: Path, metrics: dict) -> None:
        """Complete ``metrics`` (in place) from the object's files and the worker's result, and seal the
        object with its manifest (each file hashed once, here: :func:`~neuron_build.build.manifests.hash_files`)."""
        result = run.result or {}
        files, logs = hash_files(obj)
        details = dict(result.get("details", {}))
        if details.get("weights_inline_why"):  # weights = "external" asked, the compile could not keep them apart
            ctx.log.warning("weights kept inline: a change of weight values alone compiles again",
                            reason=str(details["weights_inline_why"])[:300])
        extra_metrics = details.pop("metrics", None) or {}   # backend metrics (neuron: compiler status, ...)
        extra_toolchain = details.pop("toolchain", None) or {}  # versions only the worker can see
        metrics.update(extra_metrics)
        metrics.update(op_count=result.get("op_count"), op_count_source=result.get("op_count_source"),
                       artifact_bytes=sum(v["size"] for v in files.values()),
                       compiler_compile_time_s=extra_metrics.get("compiler_compile_time_s",
                                                                 details.get("compiler_compile_time_s")))
        manifest = artifact_manifest(
            ctx, req, files, logs, metrics, toolchain={**ctx.ki.details["toolchain"], **extra_toolchain},
            compiler=details, graph_key=result.get("graph_key"), graph_document=result.get("graph_document"),
            recorded_inputs=self._recorded_inputs(ctx, result.get("imported") or [], result.get("reads")),
            **self.provenance)
        self.ws.store.seal(obj, manifest)  # fsyncs every file, writes manifest.json last

    # -- the ledger (:class:`~neuron_build.build.recorder.Recorder`) ---------------------------------------
    def record_cache_hits(self, target_ids: list[str]) -> None:
        """Write one ledger object listing a ``cached`` record for each of ``target_ids`` (targets doit found
        up to date without calling :meth:`build`); best effort, like every ledger write."""
        by_id = self.ws.by_id
        self.recorder.cache_hits([(tid, self.ws.key(by_id[tid]).key) for tid in target_ids if tid in by_id])



# -- the NxDI persistent cache in and out of the store (:mod:`neuron_build.compilers.neuron.nxdi_cache`,
# :mod:`neuron_build.store.neuron_cache`): both do nothing for any other compile ---------------------------------
def restore_cache(store: ArtifactStore, ctx: BuildContext, req: CompileRequest, work: Path) -> None:
    """NxDI: restore the target's persistent-cache entries from ``store`` into ``work`` and tell the worker
    where (``req.options``); a store that cannot be read means a cold cache."""
    from neuron_build.compilers.neuron import nxdi_cache
    from neuron_build.store import neuron_cache
    if not nxdi_cache.is_nxdi(req):
        return
    cache = work / nxdi_cache.CACHE_FILES
    try:
        got = neuron_cache.restore(store, ctx.target.id, ctx.ki.details.get("toolchain", {}).get("neuronx-cc"), cache)
    except OSError as e:
        got = {"error": str(e)}
    req.options[nxdi_cache.OPTION] = str(cache.resolve())
    ctx.log.info("NxDI persistent cache", **{k: (v[:12] if isinstance(v, str) else v) for k, v in got.items()})


def remember_cache(store: ArtifactStore, ctx: BuildContext, req: CompileRequest) -> None:
    """NxDI: point the target's persistent cache at the artifact of ``ctx``'s key just published (best
    effort: a failure is logged)."""
    from neuron_build.compilers.neuron import nxdi_cache
    from neuron_build.store import neuron_cache
    if not nxdi_cache.is_nxdi(req):
        return
    man = store.manifest(ctx.ki.key)
    try:
        neuron_cache.remember(store, ctx.target.id, ctx.ki.details.get("toolchain", {}).get("neuronx-cc"),
                              ctx.ki.key, man.files if man is not None else {})
    except (OSError, ValueError) as e:
        ctx.log.warning("could not record the NxDI cache pointer", error=str(e))


__all__ = ["Builder", "remember_cache", "restore_cache"]
