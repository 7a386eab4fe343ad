"""One target: key -> lookup -> compile (subprocess) -> publish.

Domain code: no doit here (see :mod:`neuron_build.tasks`) and no torch (the compile runs in
``python -m neuron_build.worker``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.compilers.base import CompileRequest
from neuron_build.project.config import Project
from neuron_build.project.keys import COMPONENTS, KeyInfo, KeyMaker, diff_components
from neuron_build.store.locks import GB
from neuron_build.log import get_logger
from neuron_build.store.manifest import Manifest, Metrics
from neuron_build.project.matrix import Target, expand
from neuron_build.store import open_store
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.build.peaks import expected_peak
from neuron_build.status import STATUSES, Status, TargetState
from neuron_build.util import file_sha256, is_disk_full, read_json, utc_now
from neuron_build.project.toolchain import announce_backend, neuron_status

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
TRANSIENT_EXIT = 70  # [seen] neuronx-cc exits 70 on transient tool failures
#: The worker's stdout/stderr in an artifact. ``compile.log`` is the compiler's own log (neuronx-cc's).
WORKER_LOG = "worker.log"


@dataclass
class Outcome:
    """The result of building one target.

    ``status`` is ``cached`` (nothing compiled; ``reason`` starts with ``reused:`` when another builder
    compiled it while this one waited for the key's lock) or a manifest status (``PASS``, ``ERROR``,
    ``KILLED``, ``TIMEOUT``, ``TRANSIENT``, ``TOOLCHAIN_MISSING``); ``reason`` is one line for the CLI.
    A target skipped by ``retry_failed=False`` keeps its recorded failure status, with ``compiled`` False
    and a reason starting ``not retried``.
    """

    target: str
    key: str
    status: str
    reason: str = ""
    compiled: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("cached", "PASS")


@dataclass
class _Run:
    exit_code: int | None
    wall_s: float
    peak_rss: int
    timed_out: bool
    log: bytes


def _set_pdeathsig() -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGKILL the worker when the build process dies, so no orphan compile goes on."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants, 0 when it is gone."""
    try:
        import psutil
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except Exception:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except Exception:
            pass
    return total


class Builder:
    """Builds targets of one project into its store.

    Args:
        project: the loaded config.
        backend: override ``[build] backend`` (tests, CLI).
    """

    def __init__(self, project: Project, backend: str | None = None):
        self.project = project
        self.store = open_store(project.store_url())
        self.keys = KeyMaker(project, backend=backend)
        self.targets = expand(project)
        self.by_id = {t.id: t for t in self.targets}
        self._keyinfo: dict[str, KeyInfo] = {}
        mem = project.config.build.max_host_memory_gb
        self.memory = self.store.memory_budget(int(mem * GB) if mem is not None else None,
                                               heartbeat_s=project.config.build.heartbeat_s)
        self._toolchain_problem: str | None | bool = False  # False: not checked yet
        announce_backend(self.keys.backend_note)  # "backend auto: using inductor because ...", once per process

    # -- planning ----------------------------------------------------------------------------
    def key(self, target: Target) -> KeyInfo:
        ki = self._keyinfo.get(target.id)
        if ki is None:
            ki = self._keyinfo[target.id] = self.keys.key(target)
        return ki

    def state(self, target: Target) -> str:
        """``cached`` (a complete artifact for the current key), ``failed`` (the last compile of the current
        key failed; it will be retried) or ``missing``."""
        key = self.key(target).key
        if self.store.repair(key).hit:
            return TargetState.CACHED
        fail = self.store.failure(target.id)
        return TargetState.FAILED if fail and fail.key == key else TargetState.MISSING

    def changed(self, target: Target) -> tuple[list[str], str | None]:
        """What changed since the target was last built: (components with sub-keys, compared-with id).

        For a target never built (e.g. a new bucket value), the comparison is with the most similar
        recorded target of the same model, dtype and profile that is no longer in the matrix.
        """
        ki = self.key(target)
        rec = self.store.target(target.id)
        if rec and rec.details is not None:
            return ([] if rec.key == ki.key else diff_components(rec.details, ki.details)), target.id
        best: tuple[int, list[str], str] | None = None
        for r in self.store.targets(target.model):
            tid = r.target
            if tid in self.by_id or r.details is None:
                continue
            parts = tid.split("/")
            if len(parts) != 4 or parts[2] != target.dtype or parts[3] != target.profile:
                continue
            diff = diff_components(r.details, ki.details)
            if best is None or len(diff) < best[0]:
                best = (len(diff), diff, tid)
        if best is None:
            return ["new target"], None
        return best[1], best[2]

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
        log = get_logger(target=target.id, key=ki.key[:12])
        if self.store.repair(ki.key).hit:
            self._remember(target, ki, Status.PASS)
            log.debug("cached")
            return Outcome(target.id, ki.key, "cached")
        if not retry_failed:
            fail = self.store.failure(target.id)
            if fail and fail.key == ki.key:
                log.info("not retried: failed last time", status=fail.status)
                return Outcome(target.id, ki.key, fail.status,
                               f"not retried (--no-retry-failed); failed last time: {fail.reason}")
        cfg = self.project.config.build
        lock = self.store.key_lock(ki.key, target=target.id, heartbeat_s=cfg.heartbeat_s)
        try:
            lock.acquire()
        except OSError as e:
            if not is_disk_full(e):
                raise
            reason = f"no space left on device while taking the key's lock ({lock.path}); free space and build again"
            log.error("compile failed", status="ERROR", reason=reason)
            return Outcome(target.id, ki.key, "ERROR", reason)
        with lock:
            if self.store.repair(ki.key).hit:
                self._remember(target, ki, Status.PASS)
                who = lock.waited_for or {}
                by = f"pid {who['pid']} on {who.get('host')}" if who.get("pid") else "another builder"
                log.info("reused", built_by=by, waited_s=round(lock.waited_s, 1))
                return Outcome(target.id, ki.key, "cached",
                               f"reused: built by {by} while this builder waited {lock.waited_s:.1f} s")
            peak = expected_peak(self.store, target.model, target.bucket_id, int(cfg.default_compile_memory_gb * GB))
            with self.memory.reserve(peak.bytes, target.id, log, peak.source):
                return self._build_locked(target, ki, log)

    def _build_locked(self, target: Target, ki: KeyInfo, log) -> Outcome:
        retries = self.project.config.build.transient_retries
        attempt = 0
        while True:
            attempt += 1
            out = self._compile(target, ki, attempt, log)
            if out.status != "TRANSIENT" or attempt > retries:
                return out
            log.warning("transient compiler failure, retrying", attempt=attempt, retries=retries)

    def _remember(self, target: Target, ki: KeyInfo, status: str) -> None:
        rec = self.store.target(target.id)
        if rec and rec.key == ki.key and rec.status == status:
            return
        try:
            self.store.put_target(TargetRecord(target=target.id, key=ki.key, status=status, details=ki.details,
                                               hashes=ki.hashes, time=utc_now()))
        except OSError as e:
            if not is_disk_full(e):
                raise
            get_logger(target=target.id).warning("could not record the target (disk full)", error=str(e))

    def request(self, target: Target, ki: KeyInfo, out_dir: Path, work_dir: Path) -> CompileRequest:
        """The worker request for a target."""
        cfg = self.project.config
        m, prof = cfg.models[target.model], cfg.profiles[target.profile]
        return CompileRequest(
            target=target.id, key=ki.key, root=str(self.project.root), factory=m.factory, kwargs=dict(m.kwargs),
            dtype=target.dtype, inputs=ki.details["inputs"]["inputs"], backend=self.keys.backend,
            hardware_target=self.keys.hardware_target, compiler_args=list(prof.compiler_args),
            inline_weights_to_neff=prof.inline_weights_to_neff, tp_degree=prof.tp_degree,
            out_dir=str(out_dir), work_dir=str(work_dir), seed=int(ki.key[:8], 16))

    def toolchain_problem(self) -> str | None:
        """For the neuron backend: the one-sentence reason the toolchain is unusable (from package
        metadata, checked once per Builder), else None. Such targets fail as TOOLCHAIN_MISSING without
        starting a worker."""
        if self._toolchain_problem is False:
            self._toolchain_problem = None
            if self.keys.backend == "neuron":
                st = neuron_status()
                self._toolchain_problem = None if st.usable else st.problem
        return self._toolchain_problem  # type: ignore[return-value]

    def _missing_toolchain(self, target: Target, ki: KeyInfo, reason: str, attempt: int, log) -> Outcome:
        metrics = {"status": "TOOLCHAIN_MISSING", "compile_time_s": 0.0, "peak_rss_bytes": 0, "exit_code": None,
                   "attempts": attempt, "reason": reason}
        self.store.put_failure(FailureRecord(target=target.id, key=ki.key, status=Status.TOOLCHAIN_MISSING,
                                             reason=reason, attempts=attempt, details={"backend": self.keys.backend},
                                             time=utc_now()), (reason + "\n").encode())
        self._remember(target, ki, "TOOLCHAIN_MISSING")
        log.error("compile failed", status="TOOLCHAIN_MISSING", reason=reason)
        return Outcome(target.id, ki.key, "TOOLCHAIN_MISSING", reason, compiled=False, metrics=metrics)

    def _compile(self, target: Target, ki: KeyInfo, attempt: int, log) -> Outcome:
        problem = self.toolchain_problem()
        if problem:
            return self._missing_toolchain(target, ki, problem, attempt, log)
        staging = None
        try:
            staging = self.store.new_staging(ki.key)
            obj, work = staging / "object", staging / "work"
            obj.mkdir()
            work.mkdir()
            req = self.request(target, ki, obj, work)
            (work / "request.json").write_text(json.dumps(req.to_json(), indent=2))
            log.info("compiling", backend=req.backend, hardware_target=req.hardware_target, attempt=attempt)
            run = self._run_worker(work, log)
            outcome = self._finish(target, ki, req, run, obj, work, attempt, log)
        except OSError as e:
            if not is_disk_full(e):
                raise
            # no room even to start the compile (staging folder, request, log)
            where = e.filename or staging or self.store.location
            reason = f"no space left on device while preparing the compile ({where}); free space and build again"
            run = _Run(None, 0.0, 0, False, b"")
            outcome = self._fail(target, ki, attempt, log, "ERROR", reason, run, {})
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        pending = getattr(outcome, "_unrecorded", None)
        if pending is not None:  # the disk was full: try again now that the staging files are gone
            try:
                self.store.put_failure(*pending)
                self._remember(target, ki, outcome.status)
            except OSError as e:
                if not is_disk_full(e):
                    raise
                log.warning("could not record the failure (disk full)", error=str(e))
        return outcome

    def _run_worker(self, work: Path, log) -> _Run:
        cfg = self.project.config.build
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        logf = open(work / WORKER_LOG, "wb")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "neuron_build.worker", str(work / "request.json")],
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(work),
                                env=env, start_new_session=True, preexec_fn=_set_pdeathsig)
        peak, timed_out, next_beat = 0, False, t0 + cfg.heartbeat_s
        status = None
        try:
            while True:
                pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    peak = max(peak, ru.ru_maxrss * 1024)
                    break
                peak = max(peak, _tree_rss(proc.pid))
                now = time.monotonic()
                if now - t0 > cfg.timeout_s:
                    timed_out = True
                    _kill_group(proc.pid)
                    _, status, ru = os.wait4(proc.pid, 0)
                    break
                if now >= next_beat:
                    log.info("still compiling", elapsed_s=round(now - t0), peak_rss_mb=round(peak / 2**20))
                    next_beat = now + cfg.heartbeat_s
                time.sleep(0.2)
        except BaseException:
            _kill_group(proc.pid)
            raise
        finally:
            logf.close()
        proc.returncode = os.waitstatus_to_exitcode(status) if status is not None else None
        _kill_group(proc.pid)  # stray grandchildren
        wall = time.monotonic() - t0
        return _Run(proc.returncode, wall, peak, timed_out, (work / WORKER_LOG).read_bytes())

    def _finish(self, target: Target, ki: KeyInfo, req: CompileRequest, run: _Run, obj: Path, work: Path,
                attempt: int, log) -> Outcome:
        result = read_json(work / "result.json")
        error = read_json(work / "error.json") or {}
        if run.timed_out:
            status, reason = "TIMEOUT", (f"stopped after {self.project.config.build.timeout_s:g} s "
                                         f"(timeout_s under [build])")
        elif run.exit_code == 0 and result is not None:
            status, reason = "PASS", ""
        elif run.exit_code is not None and run.exit_code < 0:
            sig = signal.Signals(-run.exit_code).name
            status = "KILLED"
            reason = (f"killed by {sig}" + (" (usually the kernel's out-of-memory killer)" if sig == "SIGKILL" else "")
                      + f"; peak memory {run.peak_rss / 2**30:.2f} GiB")
        elif error.get("status"):
            status, reason = error["status"], error.get("reason", "")
            if status == "KILLED":  # the compiler (a grandchild) was killed; the worker reported it
                reason += f"; peak memory {run.peak_rss / 2**30:.2f} GiB"
                cc_peak = (error.get("details") or {}).get("compiler_peak_rss_bytes")
                if cc_peak:
                    reason += f" (neuronx-cc {cc_peak / 2**30:.2f} GiB)"
        elif run.exit_code == TRANSIENT_EXIT:
            status, reason = "TRANSIENT", "exit status 70: transient tool failure"
        else:
            status, reason = "ERROR", f"worker exited with status {run.exit_code}: {_last_line(run.log)}"
        if status not in ("PASS", "TIMEOUT"):
            full = _disk_full_in(obj, run.log)
            if full:  # (torch aborts with SIGABRT when a save hits a full disk)
                status, reason = "ERROR", f"{full} while compiling; free space and build again ({reason})"
        if status == "PASS":
            try:
                return self._publish(target, ki, req, run, result, obj, attempt, log)
            except _DiskFull as e:
                status, reason = "ERROR", str(e)
        details = error.get("details") or {}
        return self._fail(target, ki, attempt, log, status, reason, run, details,
                          run.log + _compiler_log(work, details.get("compiler_log")))

    def _fail(self, target: Target, ki: KeyInfo, attempt: int, log, status: str, reason: str, run: _Run,
              details: dict, log_bytes: bytes | None = None) -> Outcome:
        """Record a failed compile under its target (best effort on a full disk) and return its outcome.
        ``log_bytes`` is the failure log (default: the worker's log)."""
        metrics = {"status": status, "compile_time_s": round(run.wall_s, 3), "peak_rss_bytes": run.peak_rss,
                   "exit_code": run.exit_code, "attempts": attempt, "reason": reason}
        prev = self.store.failure(target.id)
        total = 1 + ((prev.attempts_total or prev.attempts) if prev and prev.key == ki.key else 0)
        record = FailureRecord(target=target.id, key=ki.key, status=status, reason=reason,
                               compile_time_s=metrics["compile_time_s"], peak_rss_bytes=run.peak_rss,
                               exit_code=run.exit_code, attempts=attempt, attempts_total=total, details=details,
                               time=utc_now())
        out = Outcome(target.id, ki.key, status, reason, compiled=True, metrics=metrics)
        log_bytes = run.log if log_bytes is None else log_bytes
        try:
            self.store.put_failure(record, log_bytes)
            self._remember(target, ki, status)
        except OSError as e:
            if not is_disk_full(e):
                raise
            out._unrecorded = (record, log_bytes)  # recorded by _compile once the staging files are gone
        log.error("compile failed", status=status, reason=reason, compile_time_s=metrics["compile_time_s"])
        return out

    def _publish(self, target: Target, ki: KeyInfo, req: CompileRequest, run: _Run, result: dict, obj: Path,
                 attempt: int, log) -> Outcome:
        """Write the compile log and the manifest (last, fsynced) into the staging object and publish it.

        Raises:
            _DiskFull: the file system filled up; nothing was published.
        """
        metrics = {"status": "PASS", "compile_time_s": round(run.wall_s, 3), "peak_rss_bytes": run.peak_rss,
                   "exit_code": run.exit_code, "attempts": attempt}
        stage = "writing the artifact"
        try:
            (obj / WORKER_LOG).write_bytes(run.log)
            stage = "writing the manifest"
            self._seal(target, ki, req, run, result, obj, metrics)
            stage = "publishing"
            self.store.publish(obj, ki.key)
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise _DiskFull(f"no space left on device while {stage} ({e.filename or obj}); "
                            f"free space and build again") from e
        self.store.clear_failure(target.id)
        self._remember(target, ki, "PASS")
        log.info("built", compile_time_s=metrics["compile_time_s"], op_count=metrics["op_count"],
                 artifact_mb=round(metrics["artifact_bytes"] / 2**20, 2),
                 peak_rss_mb=round(run.peak_rss / 2**20))
        return Outcome(target.id, ki.key, "PASS", compiled=True, metrics=metrics)

    def _seal(self, target: Target, ki: KeyInfo, req: CompileRequest, run: _Run, result: dict, obj: Path,
              metrics: dict) -> None:
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


class _DiskFull(Exception):
    """The file system filled up while an artifact was written or published (the message says where)."""


def _disk_full_in(path: Path, log: bytes) -> str | None:
    """"no space left on device ..." when a failed compile ran out of disk: the log says so, or the file
    system holding ``path`` has less than 1 MiB free. None otherwise."""
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    said = b"No space left on device" in log or b"ENOSPC" in log
    if said or (free is not None and free < 2**20):
        return f"no space left on device in {path.parent}" + (f" ({free} bytes free)" if free is not None else "")
    return None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _compiler_log(work: Path, rel: str | None) -> bytes:
    """The compiler's own log (``rel``, relative to the work folder), framed for appending to the worker
    log of a failure record; empty when there is none."""
    if not rel:
        return b""
    path = work / rel
    try:
        data = path.read_bytes()
    except OSError:
        return b""
    return f"\n===== compiler log ({rel}) =====\n".encode() + data


def _last_line(log: bytes) -> str:
    lines = [ln for ln in log.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else "(empty log)"




__all__ = ["Builder", "Outcome", "STATUSES", "COMPONENTS"]
