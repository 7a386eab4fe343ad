"""The local executor: the compile of one target as a supervised ``python -m neuron_build.worker`` subprocess.

The worker runs in its own session (so its whole process group can be killed) and is SIGKILLed by Linux
when the build process dies (``PR_SET_PDEATHSIG``), so no orphan compile goes on. The peak memory is the
maximum of ``wait4``'s ``ru_maxrss`` and the resident memory of the process tree sampled every 0.2 s.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from neuron_build.build.executor import WORKER_LOG, CompileRun
from neuron_build.compilers.base import CompileRequest
from neuron_build.errors import NeuronBuildError
from neuron_build.util import read_json

#: The folder holding the ``neuron_build`` package, put first on the worker's PYTHONPATH.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
#: How often the worker's process tree is polled, seconds.
POLL_S = 0.2


class CompileCancelled(NeuronBuildError):
    """The compile was stopped because whoever asked for it no longer wants it (a cancelled Dask task);
    its worker's process group was killed and nothing of it is published."""


class LocalExecutor:
    """Runs the worker as a subprocess of this process and supervises it.

    Args:
        timeout_s: wall-time limit of one compile, seconds; past it the worker's process group is
            SIGKILLed and the run comes back with ``timed_out`` True.
        heartbeat_s: how often a ``still compiling`` event (elapsed seconds, peak MiB) is logged, seconds.
        should_stop: polled every 0.2 s while the worker runs (optional); when it returns True the
            worker's process group is SIGKILLed and :class:`CompileCancelled` is raised.
        memory_limit_bytes: bound on the resident memory of the worker's process tree, bytes (None:
            unbounded). Sampled every 0.2 s: past it the process group is SIGKILLed and the run comes back
            with ``out_of_memory`` True; a run that ends with a peak above it (``ru_maxrss``, between two
            samples) is out of memory too. ``memory_limit_of`` names whose bound it is, for the reason.
    """

    def __init__(self, timeout_s: float, heartbeat_s: float, should_stop: Callable[[], bool] | None = None,
                 memory_limit_bytes: int | None = None, memory_limit_of: str = "the executor's memory limit"):
        self.timeout_s = timeout_s
        self.heartbeat_s = heartbeat_s
        self.should_stop = should_stop
        self.memory_limit_bytes = memory_limit_bytes if memory_limit_bytes and memory_limit_bytes > 0 else None
        self.memory_limit_of = memory_limit_of

    def run(self, request: CompileRequest, work_dir: Path, log: Any) -> CompileRun:
        """Write ``request.json`` into ``work_dir``, run the worker on it with its output in ``worker.log``
        there, wait for it (killing its process group on a timeout, or when this process is interrupted),
        and read back what it reported (``result.json``, ``error.json``, the compiler log it names).

        The worker writes the artifact's files into ``request.out_dir`` itself (a local folder).

        Raises:
            OSError: writing the request or the log failed, or the worker could not be started.
            CompileCancelled: ``should_stop`` said so; the worker is dead.
        """
        (work_dir / "request.json").write_text(json.dumps(request.to_json(), indent=2))
        with open(work_dir / WORKER_LOG, "wb") as logf:
            t0 = time.monotonic()
            proc = spawn_worker([str(work_dir / "request.json")], work_dir, logf)
            peak, timed_out, next_beat = 0, False, t0 + self.heartbeat_s
            limit, oom = self.memory_limit_bytes, False
            status = None
            try:
                while True:
                    pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        peak = max(peak, ru.ru_maxrss * 1024)
                        break
                    peak = max(peak, _tree_rss(proc.pid))
                    if limit is not None and peak > limit:  # over the bound: stop it now
                        oom = True
                        kill_group(proc.pid)
                        _, status, ru = os.wait4(proc.pid, 0)
                        log.warning("compile over its memory limit: killed", peak_rss_mb=round(peak / 2**20),
                                    limit_mb=round(limit / 2**20), limit_of=self.memory_limit_of)
                        break
                    now = time.monotonic()
                    if now - t0 > self.timeout_s:
                        timed_out = True
                        kill_group(proc.pid)
                        _, status, ru = os.wait4(proc.pid, 0)
                        break
                    if self.should_stop is not None and self.should_stop():
                        log.warning("compile cancelled", elapsed_s=round(now - t0, 1))
                        raise CompileCancelled(f"compile of {request.target} cancelled after {now - t0:.1f} s")
                    if now >= next_beat:
                        log.info("still compiling", elapsed_s=round(now - t0), peak_rss_mb=round(peak / 2**20))
                        next_beat = now + self.heartbeat_s
                    time.sleep(POLL_S)
            except BaseException:
                kill_group(proc.pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(proc.pid, 0)  # reap it: no zombie left behind
                raise
        proc.returncode = os.waitstatus_to_exitcode(status) if status is not None else None
        kill_group(proc.pid)  # stray grandchildren
        wall = time.monotonic() - t0
        worker_log = (work_dir / WORKER_LOG).read_bytes()
        result = read_json(work_dir / "result.json")
        error = read_json(work_dir / "error.json")
        named = ((error or {}).get("details") or {}).get("compiler_log")
        oom = oom or (limit is not None and peak > limit)  # ended above the bound between two samples
        return CompileRun(exit_code=proc.returncode, wall_s=wall, peak_rss_bytes=peak, timed_out=timed_out,
                          log=worker_log, result=result, error=error, compiler_log=_compiler_log(work_dir, named),
                          memory_limit_bytes=limit, memory_limit_of=self.memory_limit_of if limit else "",
                          out_of_memory=oom)


_libc: Any = None


def _prctl():
    """libc's ``prctl``, loaded once (in the parent, so a forked child does not dlopen), or None."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    return _libc.prctl if _libc else None


def die_with_parent(parent_pid: int | None = None) -> None:  # pragma: no cover - runs in the child
    """Ask Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``), so no orphan compile
    goes on. A no-op where ``prctl`` is unavailable.

    Args:
        parent_pid: the pid of the process that forked this one. When given and the parent is already
            gone (it died between the fork and this call, before the request could take effect), the
            process exits at once instead of running as an orphan.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants, 0 when it is gone."""
    try:
        import psutil
    except ImportError:
        return 0
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except (psutil.Error, OSError):
        return 0
    total = 0
    for q in procs:
        with contextlib.suppress(psutil.Error, OSError):  # a process that exited meanwhile
            total += q.memory_info().rss
    return total


def spawn_worker(args: list[str], cwd: Path, log: Any) -> subprocess.Popen:
    """Start ``python -m neuron_build.worker ARGS`` (a compile worker, or the graph probe's ``--graphs``) in
    its own session, so :func:`kill_group` stops it with everything it started; this checkout first on
    ``PYTHONPATH``, unbuffered, its stdout and stderr into the open binary file ``log``, no stdin, working
    folder ``cwd``; SIGKILLed when this process dies (:func:`die_with_parent`).

    Raises:
        OSError: the worker could not be started.
    """
    _prctl()  # loaded here, before the fork
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # preexec_fn: PR_SET_PDEATHSIG can only be set in the child process
    return subprocess.Popen([sys.executable, "-m", "neuron_build.worker", *args], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(cwd), env=env,
                            start_new_session=True, preexec_fn=partial(die_with_parent, os.getpid()))


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (the worker's session); quiet when it is gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _compiler_log(work_dir: Path, rel: str | None) -> bytes | None:
    """The compiler's own log (``rel``, relative to the work folder), or None when the worker named none or
    it cannot be read."""
    if not rel:
        return None
    try:
        return (work_dir / rel).read_bytes()
    except OSError:
        return None


__all__ = ["PACKAGE_PARENT", "CompileCancelled", "LocalExecutor", "die_with_parent", "kill_group", "spawn_worker"]
