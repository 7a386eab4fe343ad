"""Owner records of locks, leases and memory reservations: a process is named by pid, boot id and its start
in clock ticks after boot (``/proc/<pid>/stat`` field 22), never by a wall-clock start time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from neuron_build.store import owners
from neuron_build.store.owners import owner_alive, owner_record


def test_start_ticks_are_field_22_of_proc_stat_even_with_a_paren_in_the_name(tmp_path):
    from neuron_build.store.owners import boot_id, proc_start_ticks

    stat = open(f"/proc/{os.getpid()}/stat").read()
    assert proc_start_ticks(os.getpid()) == int(stat[stat.rindex(")") + 2:].split()[19])
    # a process whose name holds ") (" and spaces: the fields are counted after the last ')'
    exe = tmp_path / "odd ) ( name"
    exe.symlink_to(sys.executable)
    p = subprocess.Popen([str(exe), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while ") (" not in (stat := open(f"/proc/{p.pid}/stat").read()).split(" ", 1)[1][:20]:
            assert time.monotonic() < deadline, stat  # exec'd under its odd name
            time.sleep(0.01)
        ticks = proc_start_ticks(p.pid)
        assert ticks == int(stat[stat.rindex(")") + 2:].split()[19]) and ticks >= proc_start_ticks(os.getpid())
    finally:
        p.kill()
        p.wait()
    assert proc_start_ticks(p.pid) is None  # gone
    assert len(boot_id()) == 36


def test_a_live_owner_stays_alive_when_the_wall_clock_steps(monkeypatch):
    """psutil's start time is the boot time (derived from the wall clock) plus the ticks: a clock step moves
    it by seconds. The old check compared it within 1 s and judged a live compiling holder dead."""
    me = owner_record(token="t")
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 2.5)  # NTP stepped the clock
    assert owner_alive(me) is True
    from neuron_build.store.owners import boot_id, proc_start_ticks

    assert me["proc_start_ticks"] == proc_start_ticks(os.getpid()) and me["boot_id"] == boot_id()


def test_a_reused_pid_another_boot_and_another_host_are_not_the_owner():
    from neuron_build.store.owners import boot_id, proc_start_ticks

    me = owner_record()
    assert owner_alive({**me, "proc_start_ticks": me["proc_start_ticks"] + 1}) is False  # pid reused since
    assert owner_alive({**me, "boot_id": "00000000-0000-0000-0000-000000000000"}) is False  # the host rebooted
    assert owner_alive({**me, "host": "another-host"}) is None  # unknown: waited for, never taken over
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert owner_alive({**me, "pid": p.pid, "proc_start_ticks": None}) is False  # gone
    assert owner_alive({"pid": os.getpid(), "host": me["host"], "proc_start": 1.0}) is True  # an old record: pid runs
    assert owners.process_identity(me) == (os.getpid(), boot_id(), proc_start_ticks(os.getpid()))
