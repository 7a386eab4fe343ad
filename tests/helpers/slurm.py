"""A real one-node Slurm on this host for tests: Debian's ``munged``, ``slurmctld`` and ``slurmd`` started as
subprocesses (as root, no systemd), every file of theirs in one scratch folder, on ports of their own, so two
test runs on one machine do not meet.

:class:`LocalSlurm` writes ``slurm.conf`` (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``SelectType=select/cons_tres`` with ``CR_Core_Memory``, the node's real CPUs and a ``RealMemory`` below the
host's, ``SlurmUser=root``), makes a munge key, starts ``munged`` on a socket of its own, then ``slurmctld -D``
and ``slurmd -D``, and waits until ``sinfo`` shows the node idle. Every Slurm command (``sbatch``, ``squeue``,
``scancel``: dask-jobqueue's too) finds this cluster through ``SLURM_CONF``, which :meth:`LocalSlurm.env`
sets. :meth:`LocalSlurm.stop` cancels every job, stops the daemons and kills whatever still runs with this
cluster's ``SLURM_CONF`` in its environment (job steps outlive ``slurmd``).

The packages: ``apt-get install slurmctld slurmd slurm-client munge`` (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from tests.helpers.daskkit import free_port

#: MiB of the host's memory the node declares (Slurm refuses a node that declares more than it has).
NODE_MEMORY_MIB = 4096

CONF = """\
ClusterName=nbtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
KillWait=2
InactiveLimit=0
MinJobAge=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


class LocalSlurm:
    """A one-node Slurm cluster in ``root`` (see the module's docstring). ``partition`` is its one queue."""

    partition = "debug"

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "run" / "munge.socket"
        self.host = socket.gethostname()
        self.cpus = os.cpu_count() or 1
        self.procs: dict[str, subprocess.Popen] = {}

    # -- the environment ---------------------------------------------------------------------------------
    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default ``os.environ``) with ``SLURM_CONF`` naming this cluster's configuration."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command (``sinfo``, ``squeue``, ``scancel``, ...) against this cluster."""
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout)

    # -- starting ------------------------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        """Write the configuration, start munged, slurmctld and slurmd, and wait for the node to be idle.

        Raises:
            RuntimeError: a Slurm or munge command is not installed (the message says how to install it), a
                daemon exited or the node did not become idle within ``timeout`` seconds; the
                message carries the end of the daemons' logs.
        """
        missing = [c for c in ("munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "sinfo")
                   if shutil.which(c) is None]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not installed: apt-get install -y slurmctld slurmd slurm-client "
                               f"munge (.ci/run does this)")
        for d in ("etc", "state", "spool", "run", "log", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        mem = min(NODE_MEMORY_MIB, psutil.virtual_memory().total // 2**20 - 512)
        self.conf.write_text(CONF.format(host=self.host, root=self.root, cpus=self.cpus, memory=mem,
                                         ctld_port=free_port(), slurmd_port=free_port(),
                                         munge_socket=self.munge_socket))
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--log-file={self.root}/log/munged.log",
                               f"--pid-file={self.root}/run/munged.pid", f"--seed-file={self.root}/munge/seed"])
        self._wait(self._munge_ok, 20, "munged did not answer on its socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("sinfo", "-h").returncode == 0, timeout, "slurmctld did not answer sinfo")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        self._wait(lambda: self.node_state().startswith("idle"), timeout, "the node did not become idle")

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen([shutil.which(argv[0]) or argv[0], *argv[1:]], stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                                            start_new_session=True)

    def _munge_ok(self) -> bool:
        cred = subprocess.run(["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10)
        if cred.returncode != 0:
            return False
        back = subprocess.run(["unmunge", "-S", str(self.munge_socket)], input=cred.stdout, capture_output=True,
                              timeout=10)
        return back.returncode == 0

    def _wait(self, ok, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"{what}: {dead} exited\n{self.logs()}")
            if ok():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} within {timeout} s\n{self.logs()}")

    def logs(self, tail: int = 15) -> str:
        """The last ``tail`` lines of every daemon's log (for failure messages)."""
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            lines = f.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- looking -------------------------------------------------------------------------------------------
    def node_state(self) -> str:
        """``sinfo``'s state of the node (``idle``, ``mixed``, ``alloc``, ``down*``, ...; "" when unknown)."""
        r = self.run("sinfo", "-h", "-N", "-o", "%T")
        return r.stdout.strip() if r.returncode == 0 else ""

    def jobs(self) -> dict[str, str]:
        """job id -> state (``PENDING``, ``RUNNING``, ...) of the jobs Slurm holds now."""
        r = self.run("squeue", "-h", "-o", "%i %T")
        return dict(ln.split() for ln in r.stdout.splitlines() if ln.strip()) if r.returncode == 0 else {}

    def job_of_pid(self, pid: int) -> str | None:
        """The Slurm job id a process of this cluster runs in (its ``SLURM_JOB_ID``), None when not in one."""
        try:
            return psutil.Process(pid).environ().get("SLURM_JOB_ID")
        except psutil.Error:
            return None

    # -- stopping ------------------------------------------------------------------------------------------
    def mine(self) -> list[psutil.Process]:
        """Running processes with this cluster's ``SLURM_CONF`` in their environment (daemons, job steps,
        the jobs' processes), this process excluded."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and p.environ().get("SLURM_CONF") == str(self.conf):
                    out.append(p)
            except psutil.Error:
                continue
        return out

    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what is left of this cluster."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", "root")
            end = time.monotonic() + 10
            while self.jobs() and time.monotonic() < end:
                time.sleep(0.3)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
        for p in self.mine():
            try:
                p.kill()
            except psutil.Error:
                pass
