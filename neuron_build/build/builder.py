"""One target: key -> lookup -> compile (through an executor) -> publish.

Domain code: no doit here (see :mod:`neuron_build.tasks`) and no torch (the compile runs in
``python -m neuron_build.worker``, started by the :class:`~neuron_build.build.executor.Executor`).

The layers: :class:`~neuron_build.build.planner.Planner` (keys, state, what changed, requests),
:class:`~neuron_build.build.executor.Executor` (runs one compile: :class:`~neuron_build.build.local.LocalExecutor`
by default), :mod:`neuron_build.build.attempt` (what a run means, the full-disk failures) and the
:class:`Builder` here, which holds the key's lock and the memory reservation, retries transient failures,
records failures and publishes artifacts.
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import (
    Classification,
    DiskFull,
    Outcome,
    as_status,
    classify,
    disk_full,
    failure_log,
    free_space,
)
from neuron_build.build.executor import NOT_RUN, WORKER_LOG, CompileRun, Executor
from neuron_build.build.local import LocalExecutor
from neuron_build.build.peaks import expected_peak
from neuron_build.build.planner import Planner
from neuron_build.compilers.base import CompileRequest
from neuron_build.log import get_logger
from neuron_build.project.config import Project
from neuron_build.project.keys import COMPONENTS, KeyInfo
from neuron_build.project.matrix import Target
from neuron_build.project.toolchain import announce_backend, neuron_status
from neuron_build.status import BuildResult, Status, TargetState
from neuron_build.store import open_store
from neuron_build.store.locks import GB
from neuron_build.store.manifest import Manifest, Metrics
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.util import file_sha256, utc_now


@dataclass(frozen=True)
class BuildContext:
    """One target being built: the target, its key, the attempt's number (1 for the first compile, 0
    before any) and the logger bound to the target."""

    target: Target
    ki: KeyInfo
    log: Any
    attempt: int = 0


@dataclass(frozen=True)
class Unrecorded:
    """A failed attempt whose failure record could not be written because the disk was full: ``record``
    and ``log`` are written once the attempt's staging files are gone."""

    outcome: Outcome
    record: FailureRecord
    log: bytes


class Builder:
    """Builds targets of one project into its store.

    Args:
        project: the loaded config.
        backend: override ``[build] backend`` (tests, CLI).
        executor: runs each compile; default a :class:`~neuron_build.build.local.LocalExecutor` with the
            project's ``[build] timeout_s`` and ``heartbeat_s``.
    """

    def __init__(self, project: Project, backend: str | None = None, executor: Executor | None = None):
        self.project = project
        self.store = open_store(project.store_url())
        self.planner = Planner(project, self.store, backend=backend)
        self.keys = self.planner.keys
        self.targets = self.planner.targets
        self.by_id = self.planner.by_id
        cfg = project.config.build
        mem = cfg.max_host_memory_gb
        self.memory = self.store.memory_budget(int(mem * GB) if mem is not None else None,
                                               heartbeat_s=cfg.heartbeat_s)
        self.executor: Executor = executor if executor is not None else LocalExecutor(cfg.timeout_s, cfg.heartbeat_s)
        self._toolchain_problem: str | None | bool = False  # False: not checked yet
        announce_backend(self.keys.backend_note)  # "backend auto: using inductor because ...", once per process

    # -- planning (see Planner) --------------------------------------------------------------
    def key(self, target: Target) -> KeyInfo:
        """The target's key (computed once per builder)."""
        return self.planner.key(target)

    def state(self, target: Target) -> TargetState:
        """``cached``, ``failed`` or ``missing``: see :meth:`Planner.state`."""
        return self.planner.state(target)

    def changed(self, target: Target) -> tuple[list[str], str | None]:
        """What changed since the target was last built: see :meth:`Planner.changed`."""
        return self.planner.changed(target)

    def request(self, target: Target, ki: KeyInfo, out_dir: Path, work_dir: Path) -> CompileRequest:
        """The worker request for a target: see :meth:`Planner.request`."""
        return self.planner.request(target, ki, out_dir, work_dir)

    def toolchain_problem(self) -> str | None:
        """For the neuron and torchneuron backends: the one-sentence reason the toolchain is unusable (from package
        metadata, checked once per Builder), else None. Such targets fail as TOOLCHAIN_MISSING without
        starting a worker."""
        if self._toolchain_problem is False:
            self._toolchain_problem = None
            if self.keys.backend in ("neuron", "torchneuron"):
                st = neuron_status()
                self._toolchain_problem = None if st.usable else st.problem
        return self._toolchain_problem  # type: ignore[return-value]

    # -- building ----------------------------------------------------------------------------
    def build(self, target: Target, retry_failed: bool = True) -> Outcome:
        """Build one target unless the store already holds its artifact.

        The compile runs under the key's cross-process lock (:class:`~neuron_build.store.locks.KeyLock`): a
        second builder of the same key waits, then reuses the first one's artifact. Before it starts, the
        compile reserves its expected peak memory in the host's budget (``[build] max_host_memory_gb``).

        Never raises for a compile failure (a full disk included): the failure is recorded under the
        target and returned. Transient failures (exit status 70) are retried up to ``[build]
        transient_retries`` times. With ``retry_failed`` False, a target whose current key failed last
        time is not compiled again (its recorded failure is returned).
        """
        ki = self.key(target)
        ctx = BuildContext(target, ki, get_logger(target=target.id, key=ki.key[:12]))
        if self.store.repair(ki.key).hit:
            self._remember(ctx, Status.PASS)
            ctx.log.debug("cached")
            return Outcome(target.id, ki.key, BuildResult.CACHED)
        if not retry_failed:
            fail = self.store.failure(target.id)
            if fail and fail.key == ki.key:
                ctx.log.info("not retried: failed last time", status=fail.status)
                return Outcome(target.id, ki.key, as_status(fail.status),
                               f"not retried (--no-retry-failed); failed last time: {fail.reason}")
        cfg = self.project.config.build
        lock = self.store.key_lock(ki.key, target=target.id, heartbeat_s=cfg.heartbeat_s)
        try:
            with disk_full("taking the key's lock", lock.path, prefer_filename=False):
                lock.acquire()
        except DiskFull as e:
            ctx.log.error("compile failed", status=Status.ERROR, reason=str(e))
            return Outcome(target.id, ki.key, Status.ERROR, str(e))
        with lock:
            if self.store.repair(ki.key).hit:
                self._remember(ctx, Status.PASS)
                who = lock.waited_for or {}
                by = f"pid {who['pid']} on {who.get('host')}" if who.get("pid") else "another builder"
                ctx.log.info("reused", built_by=by, waited_s=round(lock.waited_s, 1))
                return Outcome(target.id, ki.key, BuildResult.CACHED,
                               f"reused: built by {by} while this builder waited {lock.waited_s:.1f} s")
            peak = expected_peak(self.store, target.model, target.bucket_id, int(cfg.default_compile_memory_gb * GB))
            with self.memory.reserve(peak.bytes, target.id, ctx.log, peak.source):
                return self._build_locked(ctx)

    def _build_locked(self, ctx: BuildContext) -> Outcome:
        """Compile (holding the key's lock), retrying transient failures."""
        retries = self.project.config.build.transient_retries
        while True:
            ctx = replace(ctx, attempt=ctx.attempt + 1)
            out = self._compile(ctx)
            if out.status != Status.TRANSIENT or ctx.attempt > retries:
                return out
            ctx.log.warning("transient compiler failure, retrying", attempt=ctx.attempt, retries=retries)

    def _remember(self, ctx: BuildContext, status: Status) -> None:
        """Write the target's record (its current key and last status) unless it says so already; best
        effort on a full disk."""
        target, ki = ctx.target, ctx.ki
        rec = self.store.target(target.id)
        if rec and rec.key == ki.key and rec.status == status:
            return
        try:
            with disk_full("recording the target", target.id):
                self.store.put_target(TargetRecord(target=target.id, key=ki.key, status=status, details=ki.details,
                                                   hashes=ki.hashes, time=utc_now()))
        except DiskFull as e:
            get_logger(target=target.id).warning("could not record the target (disk full)", error=str(e.__cause__))

    def _missing_toolchain(self, ctx: BuildContext, reason: str) -> Outcome:
        """Fail the attempt as TOOLCHAIN_MISSING without starting a worker."""
        status = Status.TOOLCHAIN_MISSING
        metrics = {"status": status, "compile_time_s": 0.0, "peak_rss_bytes": 0, "exit_code": None,
                   "attempts": ctx.attempt, "reason": reason}
        self.store.put_failure(FailureRecord(target=ctx.target.id, key=ctx.ki.key, status=status, reason=reason,
                                             attempts=ctx.attempt, details={"backend": self.keys.backend},
                                             time=utc_now()), (reason + "\n").encode())
        self._remember(ctx, status)
        ctx.log.error("compile failed", status=status, reason=reason)
        return Outcome(ctx.target.id, ctx.ki.key, status, reason, compiled=False, metrics=metrics)

    def _compile(self, ctx: BuildContext) -> Outcome:
        """One attempt: stage, run the executor, publish or record the failure, clean the staging folder."""
        problem = self.toolchain_problem()
        if problem:
            return self._missing_toolchain(ctx, problem)
        staging: Path | None = None
        try:
            # no room even to start the compile (staging folder, request, log)
            with disk_full("preparing the compile", lambda: staging or self.store.location):
                staging = self.store.new_staging(ctx.ki.key)
                obj, work = staging / "object", staging / "work"
                obj.mkdir()
                work.mkdir()
                req = self.request(ctx.target, ctx.ki, obj, work)
                ctx.log.info("compiling", backend=req.backend, hardware_target=req.hardware_target,
                             attempt=ctx.attempt)
                run = self.executor.run(req, work, ctx.log)
                done = self._finish(ctx, req, run, obj)
        except DiskFull as e:
            done = self._fail(ctx, Classification(Status.ERROR, str(e)), NOT_RUN)
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        if isinstance(done, Unrecorded):  # the disk was full: try again now that the staging files are gone
            try:
                with disk_full("recording the failure", ctx.target.id):
                    self.store.put_failure(done.record, done.log)
                    self._remember(ctx, done.outcome.status)
            except DiskFull as e:
                ctx.log.warning("could not record the failure (disk full)", error=str(e.__cause__))
            return done.outcome
        return done

    def _finish(self, ctx: BuildContext, req: CompileRequest, run: CompileRun, obj: Path) -> Outcome | Unrecorded:
        """Classify the worker's run, then publish the artifact (PASS) or record the failure."""
        verdict = classify(run, self.project.config.build.timeout_s, free_space(obj), obj.parent)
        if verdict.status == Status.PASS:
            try:
                return self._publish(ctx, req, run, obj)
            except DiskFull as e:
                verdict = Classification(Status.ERROR, str(e))
        return self._fail(ctx, verdict, run)

    def _fail(self, ctx: BuildContext, verdict: Classification, run: CompileRun) -> Outcome | Unrecorded:
        """Record a failed attempt under its target and return its outcome; :class:`Unrecorded` when the
        disk is too full to record it now. The failure log is the worker's log and the compiler's."""
        status, reason = verdict.status, verdict.reason
        metrics = {"status": status, "compile_time_s": round(run.wall_s, 3), "peak_rss_bytes": run.peak_rss_bytes,
                   "exit_code": run.exit_code, "attempts": ctx.attempt, "reason": reason}
        prev = self.store.failure(ctx.target.id)
        total = 1 + ((prev.attempts_total or prev.attempts) if prev and prev.key == ctx.ki.key else 0)
        details = (run.error or {}).get("details") or {}
        record = FailureRecord(target=ctx.target.id, key=ctx.ki.key, status=status, reason=reason,
                               compile_time_s=metrics["compile_time_s"], peak_rss_bytes=run.peak_rss_bytes,
                               exit_code=run.exit_code, attempts=ctx.attempt, attempts_total=total, details=details,
                               time=utc_now())
        out = Outcome(ctx.target.id, ctx.ki.key, status, reason, compiled=True, metrics=metrics)
        log_bytes = failure_log(run)
        done: Outcome | Unrecorded = out
        try:
            with disk_full("recording the failure", ctx.target.id):
                self.store.put_failure(record, log_bytes)
                self._remember(ctx, status)
        except DiskFull:
            done = Unrecorded(out, record, log_bytes)  # recorded by _compile once the staging files are gone
        ctx.log.error("compile failed", status=status, reason=reason, compile_time_s=metrics["compile_time_s"])
        return done

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
            self.store.publish(obj, ctx.ki.key)
        self.store.clear_failure(ctx.target.id)
        self._remember(ctx, Status.PASS)
        ctx.log.info("built", compile_time_s=metrics["compile_time_s"], op_count=metrics["op_count"],
                     artifact_mb=round(metrics["artifact_bytes"] / 2**20, 2),
                     peak_rss_mb=round(run.peak_rss_bytes / 2**20))
        return Outcome(ctx.target.id, ctx.ki.key, Status.PASS, compiled=True, metrics=metrics)

    def _seal(self, ctx: BuildContext, req: CompileRequest, run: CompileRun, obj: Path, metrics: dict) -> None:
        """Complete ``metrics`` (in place) from the object's files and the worker's result, and seal the
        object with its manifest."""
        target, ki, result = ctx.target, ctx.ki, run.result or {}
        files = {}
        for f in sorted(p for p in obj.rglob("*") if p.is_file()):
            files[f.relative_to(obj).as_posix()] = {"sha256": file_sha256(f), "size": f.stat().st_size}
        details = dict(result.get("details", {}))
        extra_metrics = details.pop("metrics", None) or {}   # backend metrics (neuron: compiler status, ...)
        extra_toolchain = details.pop("toolchain", None) or {}  # versions only the worker can see
        metrics.update(extra_metrics)
        metrics.update(op_count=result.get("op_count"), op_count_source=result.get("op_count_source"),
                       artifact_bytes=sum(v["size"] for v in files.values()),
                       compiler_compile_time_s=extra_metrics.get("compiler_compile_time_s",
                                                                 details.get("compiler_compile_time_s")))
        manifest = Manifest(
            key=ki.key, target=target.id, model=target.model, bucket=dict(target.bucket), dtype=target.dtype,
            profile=target.profile, backend=req.backend, hardware_target=req.hardware_target,
            key_details=ki.details, component_hashes=ki.hashes, files=files, metrics=Metrics(**metrics),
            toolchain={**ki.details["toolchain"], **extra_toolchain}, compiler=details, created=utc_now(),
            host=socket.gethostname())
        self.store.seal(obj, manifest)  # fsyncs every file, writes manifest.json last


__all__ = ["COMPONENTS", "WORKER_LOG", "BuildContext", "Builder", "Outcome", "Unrecorded"]
