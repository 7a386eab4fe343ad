"""Real Dask clusters for tests: ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1, started the
way users start them, and a small project whose compiles are timed sleeps that record each call.

Each compile of the ``sleepy`` project appends JSON lines to ``calls.jsonl`` beside its buckets.toml:
``{"event": "start"|"end", "key": <the key, from the compile's staging folder>, "pid", "ppid", "time"}``,
so a test can count compiles per key, see which process ran them and whether they overlapped.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
DASK = str(Path(sys.executable).with_name("dask"))

SLEEPY_MODEL = '''
"""Compiles that take a fixed time: the factory sleeps, and records the call."""
import json
import os
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent.parent


def _record(event):
    key = Path.cwd().parent.name.split(".")[0]  # the worker runs in <staging>/<key>.<host>.<pid>.<tok>/work
    line = json.dumps({"event": event, "key": key, "pid": os.getpid(), "ppid": os.getppid(), "time": time.time()})
    with open(HERE / "calls.jsonl", "a") as f:
        f.write(line + "\\n")


def build(seconds: float = 1.0, width: int = 4):
    _record("start")
    time.sleep(seconds)
    _record("end")
    torch.manual_seed(0)
    return nn.Linear(width, width)


def flaky(seconds: float = 0.5, width: int = 4):
    """Exits with the transient status 70 on its first call (per project), then compiles."""
    _record("start")
    marker = HERE / "flaky.count"
    n = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(n + 1))
    if n == 0:
        os._exit(70)
    time.sleep(seconds)
    _record("end")
    return nn.Linear(width, width)


def broken(width: int = 4):
    _record("start")
    raise RuntimeError("factory exploded on purpose")
'''

SLEEPY_CONFIG = '''
[build]
backend = "torchscript"
timeout_s = 120
heartbeat_s = 1
transient_retries = 2
{build_extra}

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.sleepy]
factory = "sleepylib.models:build"
kwargs = {{ seconds = {seconds} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 4] }}]
buckets = {{ batch = {batches} }}
'''


def write_sleepy_project(root: Path, seconds: float = 1.0, batches: tuple[int, ...] = (1, 2, 3, 4),
                         build_extra: str = "", extra: str = "") -> Path:
    """A project of one model whose compile sleeps ``seconds`` (one target per batch size); returns the
    config path. ``build_extra`` goes under ``[build]``, ``extra`` at the end."""
    (root / "sleepylib").mkdir(parents=True, exist_ok=True)
    (root / "sleepylib" / "__init__.py").write_text("")
    (root / "sleepylib" / "models.py").write_text(SLEEPY_MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(SLEEPY_CONFIG.format(seconds=seconds, batches=list(batches), build_extra=build_extra)
                   + textwrap.dedent(extra))
    return cfg


def calls(project: Path) -> list[dict]:
    """Every line of the project's ``calls.jsonl``."""
    f = project / "calls.jsonl"
    return [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()] if f.exists() else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the cluster's processes (``base``, default ``os.environ``): this checkout first on
    PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["DASK_DISTRIBUTED__WORKER__DAEMON"] = "False"
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return env


class DaskCluster:
    """A scheduler and workers as real processes (``dask scheduler`` / ``dask worker``) on 127.0.0.1.

    Workers run with ``--no-nanny`` (the worker process is the one a test kills) and one thread each
    unless told otherwise. ``address`` is ``tcp://127.0.0.1:<port>``; ``env`` is the processes'
    environment (default ``os.environ``), with this checkout first on PYTHONPATH.
    """

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None):
        self.log_dir = log_dir
        self.env = dask_env(env)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self._started = 0

    def _spawn(self, name: str, argv: list[str], prefix: list[str] | None = None) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.log", "ab")
        return subprocess.Popen([*(prefix or []), *argv], stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    def start_scheduler(self) -> None:
        self.scheduler = self._spawn("scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                                   "--dashboard-address", ":0", "--no-show"])
        _wait_port(self.port, 30)

    def add_worker(self, nthreads: int = 1, resources: str | None = None, prefix: list[str] | None = None,
                   wait: bool = True) -> subprocess.Popen:
        """Start a worker and (with ``wait``) return once the scheduler lists it."""
        before = len(self.worker_addresses())
        argv = [DASK, "worker", self.address, "--nthreads", str(nthreads), "--no-nanny", "--no-dashboard",
                "--host", "127.0.0.1", "--name", f"w{self._started}"]
        if resources:
            argv += ["--resources", resources]
        p = self._spawn(f"worker{self._started}", argv, prefix)
        self._started += 1
        self.workers.append(p)
        if wait:
            self.wait_workers(before + 1)
        return p

    def worker_addresses(self) -> list[str]:
        """The workers the scheduler lists now (asked through a short-lived client)."""
        from distributed import Client
        with Client(self.address, timeout=10, set_as_default=False) as c:
            return sorted(c.scheduler_info(n_workers=-1)["workers"])

    def wait_workers(self, n: int, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(self.worker_addresses()) >= n:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{n} workers did not join {self.address}")

    def alive_workers(self) -> list[subprocess.Popen]:
        return [w for w in self.workers if w.poll() is None]

    def stop(self) -> None:
        """SIGTERM every process, then SIGKILL what is still running after 3 s in all (tests need no
        graceful shutdown: the workers hold nothing)."""
        procs = [p for p in [*self.workers, self.scheduler] if p is not None]
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + 3
        for p in procs:
            try:
                p.wait(max(end - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def wait_for(fn, timeout: float, what: str = "it"):
    """``fn()``'s first truthy value, asked every 0.1 s; TimeoutError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise TimeoutError(f"waited {timeout} s for {what}")


def _wait_port(port: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def compile_processes(under: Path) -> list[psutil.Process]:
    """Running ``python -m neuron_build.worker`` processes (compiles) whose request lies under ``under`` (a
    test's tmp folder: other builds on the machine are not counted), zombies excluded."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = p.info["cmdline"] or []
            if ("neuron_build.worker" in cmd and any(str(under) in a for a in cmd)
                    and p.info["status"] != psutil.STATUS_ZOMBIE):
                out.append(p)
        except psutil.Error:
            continue
    return out
