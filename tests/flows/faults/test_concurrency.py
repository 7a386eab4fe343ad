"""Concurrent builders over one store: separate processes (neuron-build and doit, threads and processes),
per-key locks, stale locks of killed builders, the doit database, and the host-memory budget."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.store.budget import GB, MemoryBudget
from neuron_build.store.locks import KeyLock
from neuron_build.workspace import Workspace
from tests.helpers.cli import events
from tests.helpers.faultkit import (
    REPO,
    cli_env,
    compile_counts,
    kill_group,
    quick_ids,
    start,
    start_build,
    verify,
    wait_for,
    workers_alive,
    write_quick_project,
)

HOST = socket.gethostname()


def doit_args(cfg: Path, *args: str) -> list[str]:
    return ["-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent), *args, f"config={cfg}"]


def key_of(cfg: Path, target: str) -> str:
    b = Builder(Workspace(load_project(cfg)))
    return b.ws.key(b.ws.by_id[target]).key


@pytest.mark.slow
def test_eight_builders_compile_each_of_40_targets_once(tmp_path):
    """Fault: 8 builder processes start at once over one store and a 40-target matrix: six
    `neuron-build build` processes, each starting at a different target and wrapping around, and two
    `doit -n 2` processes (one with worker processes, one with threads), all in the same order racing
    for the same keys. Every builder must succeed, the build log must show each target compiled exactly
    once, and every artifact must pass `verify --deep`."""
    cfg = write_quick_project(tmp_path / "p", n=40)
    ids = quick_ids(40)
    procs = []
    for i in range(6):
        order = ids[7 * i:] + ids[:7 * i]
        procs.append(start_build(cfg, tmp_path / f"b{i}.out", *order))
    procs.append(start(doit_args(cfg, "-n", "2", "-P", "process", "build"), tmp_path / "d0.out"))
    procs.append(start(doit_args(cfg, "-n", "2", "-P", "thread", "build"), tmp_path / "d1.out"))
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=900))
        except subprocess.TimeoutExpired:
            kill_group(p)
            rcs.append("timeout")
    outs = {f.name: f.read_text() for f in sorted(tmp_path.glob("*.out"))}
    assert rcs == [0] * 8, {n: o[-2000:] for n, o in outs.items()}
    assert not any("database is locked" in o for o in outs.values())
    state = cfg.parent / ".neuron-build"
    counts = compile_counts(state)
    assert counts == {t: 1 for t in ids}, {t: n for t, n in counts.items() if n != 1}
    rc, rep = verify(cfg)
    assert rc == 0 and rep["ok"] == 40 and rep["bad"] == []
    waits, reused = len(events(state, "waiting for lock")), len(events(state, "reused"))
    print(f"8 builders x 40 targets: 40 compiles, {waits} lock waits, {reused} reused after waiting")


@pytest.mark.slow
def test_second_builder_waits_for_the_lock_then_reuses(tmp_path):
    """Fault: a second builder asks for a key while the first is compiling it. It must wait (logging
    the holder's pid), then reuse the first one's artifact: one compile, both builds succeed, and the
    second one's summary says the target was built by another builder."""
    gate = tmp_path / "gate"
    gate.write_text("")
    cfg = write_quick_project(tmp_path / "p", n=1, factory="quicklib.quick:gate", kwargs=f'{{ path = "{gate}" }}')
    state = cfg.parent / ".neuron-build"
    a = start_build(cfg, tmp_path / "a.out")
    wait_for(lambda: events(state, "compiling"), what="the first compile")
    b = start_build(cfg, tmp_path / "b.out")
    wait_for(lambda: events(state, "waiting for lock"), what="the second builder to wait")
    gate.unlink()
    assert a.wait(timeout=120) == 0 and b.wait(timeout=120) == 0
    (wait,) = events(state, "waiting for lock")
    assert wait["held_by_pid"] == a.pid and wait["held_by_host"] == HOST
    (reused,) = events(state, "reused")
    assert reused["built_by"] == f"pid {a.pid} on {HOST}"
    assert compile_counts(state) == {"quick/n1/fp32/p": 1}
    assert "1 target: 0 built, 1 cached (1 built by another builder meanwhile), 0 failed" in (tmp_path / "b.out").read_text()
    assert verify(cfg)[0] == 0


@pytest.mark.slow
def test_stale_lock_of_a_sigkilled_builder_is_replaced(tmp_path):
    """Fault: a builder is SIGKILLed while it holds a key's lock and compiles. Its worker must die with
    it, and the next builder must take the lock at once (the kernel released the flock), report the
    stale owner record with the dead pid, compile, and leave a valid artifact and no staging files."""
    gate = tmp_path / "gate"
    gate.write_text("")
    cfg = write_quick_project(tmp_path / "p", n=1, factory="quicklib.quick:gate", kwargs=f'{{ path = "{gate}" }}')
    state, store = cfg.parent / ".neuron-build", cfg.parent / "artifacts"
    key = key_of(cfg, "quick/n1/fp32/p")
    a = start_build(cfg, tmp_path / "a.out")
    wait_for(lambda: events(state, "compiling"), what="the compile")
    owner = json.loads((store / "locks" / f"{key}.owner.json").read_text())
    assert owner["pid"] == a.pid and owner["host"] == HOST and owner["target"] == "quick/n1/fp32/p"
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    wait_for(lambda: not workers_alive(str(store)), timeout=30, what="the orphaned worker to die")
    assert any((store / "staging").iterdir())
    gate.unlink()
    b = start_build(cfg, tmp_path / "b.out")
    assert b.wait(timeout=120) == 0, (tmp_path / "b.out").read_text()
    (stale,) = events(state, "stale lock from a dead builder replaced")
    assert stale["held_by_pid"] == a.pid and stale["alive"] is False
    assert compile_counts(state) == {"quick/n1/fp32/p": 2}
    assert verify(cfg)[0] == 0
    assert not any((store / "staging").iterdir())
    assert not (store / "locks" / f"{key}.owner.json").exists()


HOLD_AND_DIE = r'''
import os, signal, subprocess, sys
from neuron_build.store.locks import KeyLock
lock = KeyLock(sys.argv[1], sys.argv[2], target="quick/n1/fp32/p").acquire()
fd = lock._lock._context.lock_file_fd
# a tool started without closing descriptors keeps the lock's open file (and so its flock) alive
orphan = subprocess.Popen(["sleep", "300"], pass_fds=[fd], start_new_session=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(orphan.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''


@pytest.mark.slow
def test_lock_kept_by_an_orphan_of_a_dead_builder_is_broken(tmp_path):
    """Fault: a builder dies while a child it started (without closing descriptors) keeps its lock's
    file open, so the flock stays held although the recorded owner is dead. The next builder must notice the dead owner, wait
    the grace period, break the lock (moving the file aside), compile once and succeed."""
    cfg = write_quick_project(tmp_path / "p", n=1)
    state, store = cfg.parent / ".neuron-build", cfg.parent / "artifacts"
    key = key_of(cfg, "quick/n1/fp32/p")
    r = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, str(store), key], env=cli_env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr
    orphan = int(r.stdout.strip())
    try:
        from filelock import FileLock, Timeout
        with pytest.raises(Timeout):
            FileLock(str(store / "locks" / f"{key}.lock")).acquire(timeout=0.2)
        dead = json.loads((store / "locks" / f"{key}.owner.json").read_text())["pid"]
        b = start_build(cfg, tmp_path / "b.out")
        assert b.wait(timeout=120) == 0, (tmp_path / "b.out").read_text()
    finally:
        os.kill(orphan, signal.SIGKILL)
    (wait,) = events(state, "waiting for lock")
    assert wait["held_by_pid"] == dead
    (broke,) = events(state, "broke stale lock")
    assert broke["held_by_pid"] == dead and broke["moved_to"].startswith(f"{key}.lock.stale-{dead}-")
    assert compile_counts(state) == {"quick/n1/fp32/p": 1}
    assert verify(cfg)[0] == 0


@pytest.mark.slow
def test_two_doit_processes_on_one_project_both_finish(tmp_path):
    """Fault: two `doit build` processes on one project; the first has a failing target (with a shared
    sqlite database, doit would then hold a write transaction until its end) and is still compiling when
    the second finishes. Both must finish: the second with status 0, the first with 1 (its failure),
    and neither may report a locked database."""
    gate = tmp_path / "gate"
    gate.write_text("")
    cfg = write_quick_project(tmp_path / "p", n=2, models_extra=f'''
[models.bad]
factory = "quicklib.quick:broken"
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{{ name = "x", shape = [2, 8] }}]

[models.held]
factory = "quicklib.quick:gate"
kwargs = {{ path = "{gate}" }}
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{{ name = "x", shape = [2, 8] }}]
''')
    state = cfg.parent / ".neuron-build"
    a = start(doit_args(cfg, "build:bad/static/fp32/p", "build:held/static/fp32/p"), tmp_path / "a.out")
    wait_for(lambda: events(state, "compile failed") and len(events(state, "compiling")) == 2, what="A's failure")
    b = start(doit_args(cfg, "build:quick/n1/fp32/p", "build:quick/n2/fp32/p"), tmp_path / "b.out")
    rb = b.wait(timeout=120)
    assert a.poll() is None  # A is still compiling
    gate.unlink()
    ra = a.wait(timeout=120)
    out_a, out_b = (tmp_path / "a.out").read_text(), (tmp_path / "b.out").read_text()
    assert rb == 0, out_b
    assert ra == 1, out_a
    assert "database is locked" not in out_a + out_b
    assert not list(cfg.parent.glob("*.db*"))  # no database file is shared (or left)


@pytest.mark.slow
def test_memory_budget_queues_compiles_across_processes(tmp_path):
    """Fault: compiles that would not fit in host memory together. With max_host_memory_gb = 0.3 and an
    expected peak of 0.25 GB (default, then the recorded ~0.2+ GB peaks), a `neuron-build build -n 2`
    (threads) and a `doit -n 2 -P process` (processes) over one store must never run two compiles at
    once: the compile intervals in the build log are disjoint, the queued ones log that they wait for
    host memory, and all targets build."""
    cfg = write_quick_project(tmp_path / "p", n=6, build_extra="max_host_memory_gb = 0.3\ndefault_compile_memory_gb = 0.25")
    state = cfg.parent / ".neuron-build"
    ids = quick_ids(6)
    a = start_build(cfg, tmp_path / "a.out", "-n", "2", *ids[:3])
    b = start(doit_args(cfg, "-n", "2", "-P", "process", *[f"build:{t}" for t in ids[3:]]), tmp_path / "b.out")
    assert a.wait(timeout=300) == 0, (tmp_path / "a.out").read_text()[-3000:]
    assert b.wait(timeout=300) == 0, (tmp_path / "b.out").read_text()[-3000:]
    assert compile_counts(state) == {t: 1 for t in ids}
    ts = lambda e: dt.datetime.fromisoformat(e["timestamp"])  # noqa: E731
    start_at = {e["target"]: ts(e) for e in events(state, "compiling")}
    end_at = {e["target"]: ts(e) for e in events(state, "built")}
    spans = sorted((start_at[t], end_at[t], t) for t in ids)
    for (_, e0, t0), (s1, _, t1) in zip(spans, spans[1:], strict=False):
        assert s1 >= e0, f"{t1} started at {s1} while {t0} ran until {e0}"
    waits = events(state, "waiting for host memory")
    assert waits and all(w["max_host_memory_gb"] == 0.3 for w in waits)
    assert verify(cfg)[0] == 0


HOLD_MEMORY = r'''
import sys
from neuron_build.store.budget import MemoryBudget, GB
with MemoryBudget(sys.argv[1], int(1 * GB), poll_s=0.05).reserve(int(float(sys.argv[2]) * GB), "holder"):
    print("held", flush=True)
    sys.stdin.read()   # until the test closes stdin (or kills this process)
'''


def test_memory_ledger_drops_dead_reservations_and_admits_a_lone_compile(tmp_path):
    """Fault: a process holding a host-memory reservation is SIGKILLed, and another holds one while a
    compile that does not fit asks for its share. The dead reservation must be dropped (the next
    reservation is admitted with nothing in use), the live one must make the newcomer wait until it is
    released, and a compile larger than the whole bound runs when nothing else runs."""
    store = tmp_path / "store"

    def holder(gb: float) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLD_MEMORY, str(store), str(gb)], env=cli_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "held"
        return p

    budget = MemoryBudget(store, int(1 * GB), poll_s=0.05)
    dead = holder(0.8)
    assert [r["pid"] for r in budget.reservations()] == [dead.pid]
    dead.kill()
    dead.wait()
    with budget.reserve(int(0.8 * GB), "after-kill") as info:
        assert info["in_use_bytes"] == 0
        assert [r["target"] for r in budget.reservations()] == ["after-kill"]

    live = holder(0.6)
    admitted = threading.Event()

    def ask():
        with budget.reserve(int(0.6 * GB), "newcomer") as info:
            assert info["in_use_bytes"] == 0
            admitted.set()

    t = threading.Thread(target=ask)
    t.start()
    wait_for(lambda: any(r["target"] == "newcomer" for r in budget.reservations()), what="the newcomer to queue")
    states = {r["target"]: r["state"] for r in budget.reservations()}
    assert states == {"holder": "running", "newcomer": "waiting"}
    assert not admitted.is_set()
    live.stdin.close()
    assert live.wait(timeout=30) == 0
    t.join(timeout=30)
    assert admitted.is_set()

    with budget.reserve(int(5 * GB), "too-big-but-alone") as info:
        assert info["in_use_bytes"] == 0
    assert budget.reservations() == []


def test_key_lock_excludes_threads_of_one_process(tmp_path):
    """Fault: two threads of one builder (doit -n 2 -P thread) hold targets with the same key. The key
    lock must exclude them from each other: the second enters only after the first left."""
    order = []

    def worker(name: str, hold: float):
        with KeyLock(tmp_path, "ab" * 32, target=name, poll_s=0.02):
            order.append(("in", name))
            time.sleep(hold)
            order.append(("out", name))

    t1 = threading.Thread(target=worker, args=("first", 0.5))
    t1.start()
    wait_for(lambda: order, what="the first thread to enter")
    t2 = threading.Thread(target=worker, args=("second", 0.0))
    t2.start()
    t1.join()
    t2.join()
    assert order == [("in", "first"), ("out", "first"), ("in", "second"), ("out", "second")]
