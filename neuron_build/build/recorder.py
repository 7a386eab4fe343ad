"""What a build writes about its targets besides artifacts: the target record (its current key and last
status), the store's ledger (:mod:`neuron_build.store.ledger`, one record per event) and the kept work folders
of failed attempts (:mod:`neuron_build.store.failures`). All best effort: a store that cannot take them is
logged, never a failure of the build."""

from __future__ import annotations

import datetime as _dt
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neuron_build.backends import find_backend
from neuron_build.build.attempt import BuildContext, Classification, DiskFull, Outcome, disk_full, failure_log
from neuron_build.build.executor import NOT_RUN, CompileRun
from neuron_build.compilers.base import STAGE_PREFIX
from neuron_build.log import get_logger
from neuron_build.project.config import MonitoringSettings
from neuron_build.status import Status
from neuron_build.store import failures as kept_failures
from neuron_build.store import ledger
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.manifest import Manifest
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.util import utc_now

#: (failure stage, last compiler pass, diagnostic code), each None when unknown: see :func:`failure_stage`
Stage = tuple[str | None, str | None, str | None]


@dataclass(frozen=True)
class Unrecorded:
    """A failed attempt whose failure record could not be written because the disk was full: ``record``
    and ``log`` are written once the attempt's staging files are gone (:meth:`Recorder.late_failure`)."""

    outcome: Outcome
    record: FailureRecord
    log: bytes


class Recorder:
    """The records one builder writes into ``store``.

    Args:
        store: the store the builder builds into.
        backend: the builder's backend (``KeyMaker.backend``).
        monitoring: ``[monitoring]`` (``keep_failed_workdirs``, ``failed_workdirs_max_mb``).
        executor: the name of the executor running the compiles, asked at each record (a test may swap
            the builder's executor).
    """

    def __init__(self, store: ArtifactStore, backend: str, monitoring: MonitoringSettings,
                 executor: Callable[[], str]):
        self.store = store
        self.backend = backend
        self.monitoring = monitoring
        self.executor = executor

    def remember(self, ctx: BuildContext, status: Status) -> None:
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

    def failure(self, ctx: BuildContext, verdict: Classification, run: CompileRun) -> Outcome | Unrecorded:
        """Record a failed attempt under its target and return its outcome; :class:`Unrecorded` when the
        disk is too full to record it now. The failure log is the worker's log and the compiler's. The
        attempt's work folder ``ctx.work`` (request, worker log, the compiler's workdir; None: nothing) is kept
        in the store (``[monitoring] keep_failed_workdirs``, ``failed_workdirs_max_mb``) and the attempt goes
        to the ledger with its failure stage."""
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
                self.remember(ctx, status)
        except DiskFull:
            done = Unrecorded(out, record, log_bytes)  # recorded by late_failure once the staging files are gone
        stage = failure_stage(run, details, self.backend)
        kept = (self.keep_workdir(ctx, ctx.work, record, stage)
                if ctx.work is not None and isinstance(done, Outcome) else None)
        self.ledger(ctx, "compile", status, reason=reason, stage=stage, run=run, details=details, workdir=kept)
        ctx.log.error("compile failed", status=status, reason=reason, compile_time_s=metrics["compile_time_s"])
        return done

    def late_failure(self, ctx: BuildContext, done: Unrecorded) -> Outcome:
        """Write the failure record the full disk kept :meth:`failure` from writing (the attempt's staging
        files are gone now); still full: logged. Returns the attempt's outcome."""
        try:
            with disk_full("recording the failure", ctx.target.id):
                self.store.put_failure(done.record, done.log)
                self.remember(ctx, done.outcome.status)
        except DiskFull as e:
            ctx.log.warning("could not record the failure (disk full)", error=str(e.__cause__))
        return done.outcome

    def toolchain_missing(self, ctx: BuildContext, reason: str) -> Outcome:
        """Fail the attempt as TOOLCHAIN_MISSING without starting a worker: the failure record, the target
        record and the ledger say ``reason``."""
        status = Status.TOOLCHAIN_MISSING
        metrics = {"status": status, "compile_time_s": 0.0, "peak_rss_bytes": 0, "exit_code": None,
                   "attempts": ctx.attempt, "reason": reason}
        self.store.put_failure(FailureRecord(target=ctx.target.id, key=ctx.ki.key, status=status, reason=reason,
                                             attempts=ctx.attempt, details={"backend": self.backend},
                                             time=utc_now()), (reason + "\n").encode())
        self.remember(ctx, status)
        self.ledger(ctx, "compile", status, reason=reason, stage=("toolchain", None, None), run=NOT_RUN)
        ctx.log.error("compile failed", status=status, reason=reason)
        return Outcome(ctx.target.id, ctx.ki.key, status, reason, compiled=False, metrics=metrics)

    def cache_hits(self, hits: list[tuple[str, str]]) -> None:
        """Write one ledger object listing a ``cached`` record for each (target id, key) of ``hits``."""
        try:
            ledger.append_cache_hits(self.store, hits, self.executor(), self.backend)
        except OSError as e:
            get_logger().warning("could not write the ledger records of the cache hits", error=str(e))

    def keep_workdir(self, ctx: BuildContext, work: Path, record: FailureRecord, stage: Stage) -> str | None:
        """Keep the failed attempt's work folder in the store (best effort: a failure to keep it is logged,
        never a failure of the build). Returns the entry's store path, or None."""
        mon = self.monitoring
        if not work.is_dir():
            return None
        info = {"target": record.target, "key": record.key, "status": str(record.status), "reason": record.reason,
                "time": record.time, "failure_stage": stage[0], "compiler_pass": stage[1], "diagnostic_code": stage[2]}
        try:
            ent, removed = kept_failures.keep_workdir(self.store, work, info, mon.keep_failed_workdirs,
                                                      int(mon.failed_workdirs_max_mb * 1e6))
        except OSError as e:
            ctx.log.warning("could not keep the failure workdir", error=str(e))
            return None
        for r in removed:
            ctx.log.info("failure workdir removed (bounds under [monitoring])", workdir=r.path, of_target=r.target)
        if ent is None or ent in removed:
            return None
        ctx.log.info("failure workdir kept", workdir=ent.path, files=len(ent.files), bytes=ent.bytes)
        return ent.path

    def ledger(self, ctx: BuildContext, event: str, status: Status, *, reason: str = "",
               stage: Stage = (None, None, None), run: CompileRun | None = None, details: dict | None = None,
               metrics: dict | None = None, manifest: Manifest | None = None, workdir: str | None = None,
               reused_from: str | None = None, graph_key: str | None = None) -> None:
        """Append one record to the store's ledger (:mod:`neuron_build.store.ledger`); best effort: a store
        that cannot be written is logged, never a failure of the build."""
        m = metrics or (manifest.metrics.model_dump() if manifest is not None else {})
        diags = list((details or {}).get("diagnostics") or []) + list(m.get("diagnostics") or [])
        rec = ledger.LedgerRecord(
            target=ctx.target.id, key=ctx.ki.key, event=event, status=str(status),
            time=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds"),
            host=socket.gethostname(), executor=self.executor(),
            backend=self.backend, attempt=ctx.attempt, failure_stage=stage[0], compiler_pass=stage[1],
            diagnostic_code=stage[2], reason=reason,
            compile_time_s=round(run.wall_s, 3) if run is not None and event == "compile" else None,
            peak_rss_bytes=run.peak_rss_bytes if run is not None and event == "compile" else None,
            hbm_peak_bytes=hbm_estimate(diags), op_count=m.get("op_count"), artifact_bytes=m.get("artifact_bytes"),
            changed=ctx.changed, workdir=workdir, reused_from=reused_from, graph_key=graph_key)
        try:
            ledger.append(self.store, rec)
        except OSError as e:
            ctx.log.warning("could not write the ledger record", error=str(e))


#: ``Estimated peak HBM usage (22.84) exceeds 16GB`` (XCG815) [seen]; the figure is in GB [guess: 1e9 bytes].
_HBM = re.compile(r"peak HBM usage\s*\(\s*(\d+(?:\.\d+)?)\s*\)", re.IGNORECASE)


def hbm_estimate(diagnostics: list) -> int | None:
    """The peak HBM the compiler log estimates, bytes (GB taken as 1e9), from a diagnostic's message; None
    when no diagnostic states one."""
    for d in diagnostics:
        m = _HBM.search(str(d.get("message", "")) if isinstance(d, dict) else "")
        if m:
            return int(float(m.group(1)) * 1e9)
    return None


def failure_stage(run: CompileRun, details: dict, backend: str) -> Stage:
    """Where a failed compile stopped: (stage, last compiler pass, diagnostic code).

    The stage is the backend record's ``compiler_stage`` (``neuronx-cc``) when its compiler tool ran and failed (the worker's details carry its
    exit status, diagnostics or log), else the last ``neuron-build stage:`` line of the worker log
    (``model``, ``export``, ``compile``, ``save``, ``count``; see
    :data:`neuron_build.compilers.base.STAGES`), else None (no worker output). The pass is the last one the
    parsed compiler log shows finished (``details.log.pass_times``); the code the first error diagnostic's.
    """
    diags = [d for d in details.get("diagnostics") or [] if isinstance(d, dict)]
    code = next((d.get("code") for d in diags if d.get("severity") == "error"), None)
    passes = list((details.get("log") or {}).get("pass_times") or {})
    compiler_pass = passes[-1] if passes else None
    spec = find_backend(backend)
    if spec is not None and spec.compiler_stage and ("compiler_exit_code" in details or details.get("compiler_log")):
        return spec.compiler_stage, compiler_pass, code
    stage = None
    for line in run.log.decode("utf-8", "replace").splitlines():
        if line.startswith(STAGE_PREFIX):
            stage = line[len(STAGE_PREFIX):].strip() or None
    return stage, compiler_pass, code


__all__ = ["Recorder", "Stage", "Unrecorded", "failure_stage", "hbm_estimate"]
