"""The Dask executor against real processes: a ``dask scheduler`` and ``dask worker`` processes on
127.0.0.1 (a session fixture), and ``LocalCluster(processes=True)`` where one worker is enough.

Every compile is the ``sleepy`` project of :mod:`tests.helpers.daskkit` (a factory that sleeps about a second and
records its call), built through ``neuron-build build`` as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from neuron_build.build.progress import BuildProgress, estimate_eta, format_duration, progress_line
from tests.helpers.cli import in_a_terminal, run_cli
from tests.helpers.daskkit import (
    REPO,
    DaskCluster,
    calls,
    compile_processes,
    dask_env,
    free_port,
    wait_for,
    write_sleepy_project,
)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A scheduler and two single-thread workers (``--no-nanny``), for the whole session."""
    c = DaskCluster(tmp_path_factory.mktemp("dask-cluster"))
    c.start_scheduler()
    c.add_worker(wait=False)
    c.add_worker(wait=False)
    c.wait_workers(2)
    yield c
    c.stop()


@pytest.fixture
def two_workers(cluster):
    """The session cluster with two live workers (a test that killed one gets a new one)."""
    for w in cluster.workers:
        if w.poll() is not None:
            cluster.workers.remove(w)
    while len(cluster.alive_workers()) < 2:
        cluster.add_worker(wait=False)
    cluster.wait_workers(2)
    return cluster


def dask_project(root: Path, cluster: DaskCluster | None, **kw) -> Path:
    sched = f'executor = "dask"\nscheduler = "{cluster.address}"\n' if cluster else 'executor = "dask"\n'
    return write_sleepy_project(root, build_extra=sched + kw.pop("build_extra", ""), **kw)


def cli(cfg: Path, *args: str, timeout: float = 300):
    return run_cli("-c", str(cfg), *args, env=dask_env(), timeout=timeout)


def builder(cfg: Path):
    """The project's Builder, in this process (to read the store without one CLI process per question)."""
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace
    return Builder(Workspace(load_project(cfg)))


def manifest(b, target: str) -> dict:
    m = b.ws.store.manifest(b.ws.key(b.ws.by_id[target]).key)
    assert m is not None, f"{target} is not in the store"
    return m.model_dump(mode="json")


def starts(project: Path) -> list[dict]:
    return [c for c in calls(project) if c["event"] == "start"]


# -- building -----------------------------------------------------------------------------------------------
FLAKY_AND_BROKEN = '''
[models.flaky]
factory = "sleepylib.models:flaky"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [1, 4] }]

[models.broken]
factory = "sleepylib.models:broken"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [1, 4] }]
'''


def test_build_on_two_workers_retries_transient_only_then_noop(two_workers, tmp_path):
    cfg = dask_project(tmp_path / "p", two_workers, seconds=1.5, batches=(1, 2), extra=FLAKY_AND_BROKEN)
    r = cli(cfg, "build")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "4 targets: 3 built, 0 cached, 1 failed" in r.stdout
    assert "FAILED broken/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose" in r.stdout
    assert "compiled on 2 Dask workers" in r.stdout
    assert "4/4 done (1 failed)" in r.stderr  # the progress lines
    live = set(two_workers.worker_addresses())
    seen = set()
    b = builder(cfg)
    for t in ("sleepy/b1/fp32/p1", "sleepy/b2/fp32/p1", "flaky/static/fp32/p1"):
        m = manifest(b, t)
        assert m["executor"] == "dask" and m["scheduler"] == two_workers.address
        assert m["worker"] in live and m["metrics"]["status"] == "PASS"
        seen.add(m["worker"])
    assert len(seen) == 2, "both workers compiled"
    # every compile ran in a subprocess of a dask worker process, not of the client
    assert {c["ppid"] for c in starts(cfg.parent)} <= {w.pid for w in two_workers.workers}
    per_key: dict[str, int] = {}
    for c in starts(cfg.parent):
        per_key[c["key"]] = per_key.get(c["key"], 0) + 1
    flaky, broken = b.ws.by_id["flaky/static/fp32/p1"], b.ws.by_id["broken/static/fp32/p1"]
    # the planned keys: a passing compile publishes under the key the client planned
    assert sorted(per_key.values()) == [1, 1, 1, 2]  # flaky: exit 70, retried by Dask, then PASS
    assert per_key[b.ws.key(broken).key] == 1  # a compile error is not retried
    assert b.ws.state(flaky) == "cached"
    assert b.ws.state(broken) == "failed"
    v = cli(cfg, "verify", "--deep", "--json")
    assert v.returncode == 0, v.stdout + v.stderr
    again = cli(cfg, "build", "--no-retry-failed")
    assert "4 targets: 0 built, 3 cached, 1 failed" in again.stdout, again.stdout + again.stderr
    assert len(starts(cfg.parent)) == 5  # the second build compiled nothing


BROKEN = FLAKY_AND_BROKEN[FLAKY_AND_BROKEN.index("[models.broken]"):]


def test_build_json_on_dask_prints_only_the_json_document(two_workers, tmp_path):
    import jsonschema

    cfg = dask_project(tmp_path / "p", two_workers, seconds=0.3, batches=(1,), extra=BROKEN)
    r = cli(cfg, "build", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)  # stdout holds the JSON document and nothing else
    jsonschema.validate(doc, json.loads((REPO / "docs" / "schemas" / "build.json").read_text()))
    assert {k: doc[k] for k in ("built", "cached", "graph_reused", "failed", "not_pushed", "verdict")} == {
        "built": 1, "cached": 0, "graph_reused": 0, "failed": 1, "not_pushed": [], "verdict": "fail"}
    rows = {row["target"]: row for row in doc["targets"]}
    b = builder(cfg)
    ok, bad = rows["sleepy/b1/fp32/p1"], rows["broken/static/fp32/p1"]
    assert (ok["result"], ok["status"], ok["verdict"], ok["reason"]) == ("built", "PASS", "pass", "")
    assert ok["key"] == b.ws.key(b.ws.by_id["sleepy/b1/fp32/p1"]).key and ok["compile_time_s"] > 0
    assert (bad["result"], bad["status"], bad["verdict"]) == ("failed", "ERROR", "fail")
    assert bad["reason"] == "RuntimeError: factory exploded on purpose"
    assert bad["log"] == "neuron-build show broken/static/fp32/p1"
    assert "compiled on" not in r.stdout and "2/2 done (1 failed)" in r.stderr  # the progress goes to stderr
    again = cli(cfg, "build", "--json", "--no-retry-failed")
    doc = json.loads(again.stdout)
    assert again.returncode == 1 and (doc["built"], doc["cached"], doc["failed"]) == (0, 1, 1)
    assert [row["result"] for row in doc["targets"]] == ["cached", "failed"]


def test_a_failed_push_is_reported_by_a_dask_build_as_by_a_local_one(tmp_path):
    # the remote opens (a folder) but its blob folder is a file: every upload fails. Built here first (the
    # push fails and stays pending); the Dask build finds everything cached, retries the push, and says so
    remote = tmp_path / "remote"
    remote.mkdir()
    blocker = remote / "cas"
    blocker.write_text("a file where the remote's blob folder should be\n")
    cfg = dask_project(tmp_path / "p", None, batches=(1,), seconds=0.1,
                       build_extra=f'scheduler = "tcp://127.0.0.1:{free_port()}"\nremote = "{remote.as_uri()}"\n')
    r = cli(cfg, "build", "--executor", "local")
    assert r.returncode == 1 and "NOT PUSHED 1 artifact to" in r.stdout, r.stdout + r.stderr
    ws = builder(cfg).ws
    key = ws.key(ws.by_id["sleepy/b1/fp32/p1"]).key
    r = cli(cfg, "build")  # nothing to compile: the scheduler (nobody listens there) is never asked
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 target: 0 built, 1 cached, 0 failed" in r.stdout
    assert f"NOT PUSHED 1 artifact to {remote.as_uri()}" in r.stdout
    assert f"not pushed: sleepy/b1/fp32/p1 (key {key[:16]})" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == f"build failed: the push to {remote.as_uri()} failed"
    r = cli(cfg, "build", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["not_pushed"] == [key] and doc["verdict"] == "fail", r.stdout + r.stderr
    blocker.unlink()
    r = cli(cfg, "build", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["not_pushed"] == [] and doc["verdict"] == "pass", r.stdout + r.stderr
    assert len(starts(cfg.parent)) == 1  # compiled once, by the local build


def test_build_on_a_terminal_names_the_worker_of_each_running_compile(two_workers, tmp_path):
    cfg = dask_project(tmp_path / "p", two_workers, seconds=2.5, batches=(1, 2))
    text = in_a_terminal([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build"], cwd=cfg.parent,
                         env=dask_env())
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    workers = "|".join(re.escape(a) for a in two_workers.worker_addresses())
    for t in ("sleepy/b1/fp32/p1", "sleepy/b2/fp32/p1"):
        assert re.search(rf"compiling {t} on ({workers}) \(\d+ s", plain), plain[-3000:]
        assert re.search(rf"\[[12]/2\] {t} PASS in \d+\.\d s", plain)
    assert re.search(r"[01]/2 done", plain) and "2 targets: 2 built, 0 cached, 0 failed" in plain
    assert "running:" not in plain  # the plain progress lines are for pipes


def test_worker_killed_mid_compile_is_rescheduled(two_workers, tmp_path):
    cfg = dask_project(tmp_path / "p", two_workers, seconds=3, batches=(1,))
    proc = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build"], env=dask_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _wait_for(lambda: starts(cfg.parent), 120)[0]
        victim = psutil.Process(first["ppid"])
        assert victim.pid in {w.pid for w in two_workers.workers}
        victim_addr = {w.pid: a for w, a in _pid_to_address(two_workers).items()}.get(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)  # the worker process itself, mid-compile
        # its compile subprocess dies with it (PR_SET_PDEATHSIG), nothing is left compiling
        _wait_for(lambda: not psutil.pid_exists(first["pid"]) or
                  psutil.Process(first["pid"]).status() == psutil.STATUS_ZOMBIE, 10)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert "1 target: 1 built, 0 cached, 0 failed" in out
    again = starts(cfg.parent)
    assert len(again) == 2 and again[1]["ppid"] != victim.pid  # compiled again, on the other worker
    from neuron_build.store.verify import verify_store
    b = builder(cfg)
    m = manifest(b, "sleepy/b1/fp32/p1")
    assert m["worker"] != victim_addr and m["worker"] in two_workers.worker_addresses()
    rep = verify_store(b.ws.store, deep=True)
    assert rep.clean and rep.checked == 1, rep.to_json()  # nothing half-published


def _pid_to_address(cluster: DaskCluster) -> dict:
    from distributed import Client
    with Client(cluster.address, timeout=10, set_as_default=False) as c:
        pids = c.run(os.getpid)
    by_pid = {pid: addr for addr, pid in pids.items()}
    return {w: by_pid.get(w.pid) for w in cluster.workers}


_wait_for = wait_for


# -- faults ---------------------------------------------------------------------------------------------------
def test_scheduler_unreachable_is_one_line(tmp_path):
    port = free_port()
    cfg = write_sleepy_project(tmp_path / "p", build_extra=f'executor = "dask"\nscheduler = "tcp://127.0.0.1:{port}"\n'
                               "scheduler_timeout_s = 1\n")
    t0 = time.monotonic()
    r = cli(cfg, "build")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port}" in lines[0]
    assert "--executor local" in lines[0]
    assert time.monotonic() - t0 < 30
    assert starts(cfg.parent) == []


def test_an_http_server_as_the_scheduler_fails_within_scheduler_timeout_s(tmp_path):
    """``--scheduler`` naming a port where an HTTP server listens (a scheduler's dashboard, 8787): the
    connection opens but nothing answers as Dask; the build says so within scheduler_timeout_s, not never."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"tcp://127.0.0.1:{server.server_address[1]}"
    try:
        cfg = write_sleepy_project(tmp_path / "p", build_extra='executor = "dask"\nscheduler_timeout_s = 2\n')
        t0 = time.monotonic()
        r = cli(cfg, "build", "--executor", "dask", "--scheduler", address, timeout=60)
        took = time.monotonic() - t0
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert (f"{address} did not answer as a Dask scheduler within 2 s (is it the dashboard port? the scheduler "
            "listens on 8786 by default)") in lines[0], lines[0]
    assert took < 20, took  # 2 s of waiting, plus the CLI's start
    assert starts(cfg.parent) == []


def test_no_scheduler_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    cfg = dask_project(tmp_path / "p", None)
    r = cli(cfg, "build")
    assert r.returncode == 2
    assert "executor dask needs a scheduler" in r.stderr and "--scheduler ADDR" in r.stderr


def test_store_workers_cannot_reach_is_refused(tmp_path):
    """A worker that sees another folder at the store's path (a mount namespace with an empty folder
    bound over it: what a folder local to the client looks like from another host)."""
    cfg = write_sleepy_project(tmp_path / "p", batches=(1,))
    store = cfg.parent / "artifacts"
    store.mkdir()
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    c = DaskCluster(tmp_path / "cluster")
    c.start_scheduler()
    try:
        ns = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]  # -r: a user namespace, unprivileged
        c.add_worker(prefix=[*ns, "sh", "-c", f'mount --bind "{empty}" "{store}" && exec "$@"', "sh"])
        r = cli(cfg, "build", "--executor", "dask", "--scheduler", c.address)
    finally:
        c.stop()
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1
    assert f"the store {store} is not reachable as the same store from Dask worker tcp://127.0.0.1:" in lines[0]
    assert "no store-id.json there" in lines[0] and "--executor local" in lines[0]
    assert starts(cfg.parent) == []  # nothing was submitted


def test_ctrl_c_cancels_tasks_and_kills_compiles(two_workers, tmp_path):
    cfg = dask_project(tmp_path / "p", two_workers, seconds=60, batches=(1, 2))
    proc = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build"], env=dask_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(starts(cfg.parent)) == 2, 120)
        assert len(compile_processes(tmp_path)) == 2
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    _wait_for(lambda: not compile_processes(tmp_path), 15)  # no orphan compile on the workers
    assert not [c for c in calls(cfg.parent) if c["event"] == "end"]
    assert builder(cfg).ws.store.keys() == []  # nothing published
    from distributed import Client
    with Client(two_workers.address, timeout=10, set_as_default=False) as c:
        _wait_for(lambda: not any(c.processing().values()), 15)  # the cluster is free again


def test_two_clients_overlapping_compile_each_key_once(two_workers, tmp_path):
    cfg = dask_project(tmp_path / "p", two_workers, seconds=2, batches=(1, 2))
    a = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build", "sleepy/b1/*",
                          "sleepy/b2/*"], env=dask_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build", "sleepy/b2/*",
                          "sleepy/b1/*"], env=dask_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_a, err_a = a.communicate(timeout=300)
    out_b, err_b = b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, out_a + err_a + out_b + err_b
    keys = [c["key"] for c in starts(cfg.parent)]
    assert len(keys) == 2 and len(set(keys)) == 2, keys  # each key compiled once
    view = builder(cfg).ws
    from neuron_build.store import ledger  # the compiled keys (completed by what the factories read)
    assert sorted(r.key for r in ledger.read(view.store) if r.event == "compile") == sorted(
        view.key(t).key for t in view.targets)
    assert all(view.state(t) == "cached" for t in view.targets)
    # each target was built by exactly one of the two clients: the other found it cached (or waited on the
    # key's lock while the first compiled it); the built counts add up to the two targets, never more or less
    heads = [re.search(r"^2 targets: (\d+) built, (\d+) cached(?: \((\d+) built by another builder meanwhile\))?, "
                       r"0 failed$", o, re.M) for o in (out_a, out_b)]
    assert all(heads), out_a + out_b
    built = [int(h[1]) for h in heads]
    assert sum(built) == 2, out_a + out_b
    # and each client's per-worker line counts what it compiled (no line when it compiled nothing)
    on_workers = [sum(int(n) for n in re.findall(r"tcp://127\.0\.0\.1:\d+ \((\d+)\)", o)) for o in (out_a, out_b)]
    assert on_workers == built, out_a + out_b


# -- scheduling -------------------------------------------------------------------------------------------
def test_memory_resource_keeps_a_host_within_its_memory(tmp_path):
    """Two compiles that each expect 2 GB on a worker with 2 threads and memory_gb=3 run one after the
    other; an expected peak above every worker's memory is capped so it still runs."""
    from distributed import LocalCluster

    from neuron_build.build.builder import Builder
    from neuron_build.build.fleet.dask_executor import DaskBuild
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    cfg = write_sleepy_project(tmp_path / "p", seconds=0.5, batches=(1, 2, 3),
                               build_extra="default_compile_memory_gb = 2\n")
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = dask_env()["PYTHONPATH"]
    try:
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, resources={"memory_gb": 3},
                          dashboard_address=None, host="127.0.0.1") as lc:
            b = Builder(Workspace(load_project(cfg)))
            chosen = [t for t in b.ws.targets if t.id != "sleepy/b3/fp32/p1"]
            run = DaskBuild(b.ws, lc.scheduler_address)
            outcomes = run.run(chosen)
            assert [str(outcomes[t.id].status) for t in chosen] == ["PASS", "PASS"]
            ev = sorted(calls(cfg.parent), key=lambda c: c["time"])
            assert [c["event"] for c in ev] == ["start", "end", "start", "end"]  # never two at once
            b5 = Builder(Workspace(load_project(write_sleepy_project(tmp_path / "q", seconds=0.2, batches=(1,),
                                                           build_extra="default_compile_memory_gb = 5\n"))))
            assert DaskBuild(b5.ws, lc.scheduler_address)._resources(b5.ws.targets[0], {"w": {"resources": {"memory_gb": 3}}}) \
                == {"memory_gb": 3.0}
            assert DaskBuild(b5.ws, lc.scheduler_address)._resources(b5.ws.targets[0], {"w": {"resources": {}}}) is None
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before


# -- progress -------------------------------------------------------------------------------------------------
def test_eta_from_recorded_times():
    # 3 pending of 10 s, one running 10 s target 4 s in, one unknown pending (counts as the mean, 10 s), 2 slots
    assert estimate_eta([10.0, 10.0, 10.0, None], [(10.0, 4.0)], 2) == pytest.approx(26.0)  # 6+10+10 | 10+10
    assert estimate_eta([75.0, 75.0, 75.0], [], 2) == pytest.approx(150.0)  # not 112.5: the third runs alone
    assert estimate_eta([None], [(None, 3.0)], 4) is None
    assert estimate_eta([], [(100.0, 10.0)], 8) == pytest.approx(90.0)  # never below the longest running one
    assert estimate_eta([5.0], [(2.0, 9.0)], 1) == pytest.approx(5.0)   # an overdue compile counts 0 left


def test_progress_line():
    p = BuildProgress(total=10, done=3, failed=1, running={"b/t": "tcp://h2:1", "a/t": "tcp://h1:1"}, eta_s=65)
    assert progress_line(p) == "3/10 done (1 failed) · running: a/t on tcp://h1:1, b/t on tcp://h2:1 · ETA 1m05s"
    many = BuildProgress(10, 0, running={f"t{i}": "w" for i in range(6)})
    assert progress_line(many, max_running=2) == "0/10 done · running: t0 on w, t1 on w, +4 more"
    assert progress_line(BuildProgress(2, 2, eta_s=5)) == "2/2 done"
    assert (format_duration(42), format_duration(7260)) == ("42 s", "2h01m")



class _Done:
    """A finished future whose result raises ``exc`` (what ``as_completed`` hands back)."""

    def __init__(self, exc: BaseException):
        self.exc = exc

    def result(self):
        raise self.exc


def test_a_task_that_kept_failing_becomes_a_failed_outcome(tmp_path):
    import pickle

    from distributed import KilledWorker

    from neuron_build.build.fleet.dask_executor import DaskBuild, TransientCompileError

    b = builder(write_sleepy_project(tmp_path / "p", batches=(1,)))
    t = b.ws.targets[0]
    run = DaskBuild(b.ws, "tcp://127.0.0.1:1")
    err = TransientCompileError({"target": t.id, "key": b.ws.key(t).key, "status": "TRANSIENT", "compiled": True,
                                 "reason": "exit status 70: transient tool failure", "metrics": {},
                                 "worker": "tcp://w:1"})
    again = pickle.loads(pickle.dumps(err))  # it travels from the worker to the client
    assert again.outcome == err.outcome and str(again) == str(err)
    out = run._collect(_Done(again), t)
    assert (out.status, out.compiled) == ("TRANSIENT", True)
    assert out.reason == "exit status 70: transient tool failure (tried 3 times)"  # transient_retries = 2
    assert run.workers[t.id] == "tcp://w:1"
    dead = run._collect(_Done(KilledWorker("neuron-build-x", SimpleNamespace(address="tcp://w:2"), 3)), t)
    assert dead.status == "KILLED" and dead.reason.startswith("Dask task failed: KilledWorker")
    assert not dead.ok


def test_scheduler_address_precedence(monkeypatch):
    from neuron_build.build.fleet.dask_executor import scheduler_address
    from neuron_build.errors import UserError

    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://env:8786")
    assert scheduler_address("tcp://cli:1", "tcp://cfg:2") == "tcp://cli:1"
    assert scheduler_address(None, "tcp://cfg:2") == "tcp://cfg:2"
    assert scheduler_address(None, None) == "tcp://env:8786"
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS")
    with pytest.raises(UserError, match=r"b\.toml: executor dask needs a scheduler"):
        scheduler_address(None, None, "b.toml")


# -- memory ---------------------------------------------------------------------------------------------------
HOG_MODEL = '''
import json, os, time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent.parent


def hog(mib: int = 800, width: int = 4):
    with open(HERE / "calls.jsonl", "a") as f:
        f.write(json.dumps({"event": "start", "pid": os.getpid()}) + "\\n")
    block = bytearray(mib * 2**20)
    for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
        block[i] = 1
    time.sleep(3)
    torch.manual_seed(0)
    return torch.nn.Linear(width, width)
'''


def test_a_compile_over_the_dask_workers_memory_limit_is_stopped_and_not_retried(tmp_path):
    """A worker started with --memory-limit 600MB and a compile whose factory holds 800 MiB (plus torch):
    the compile runs outside the worker's own accounting, so the executor bounds its process tree; it is
    stopped, reported as out of memory with both figures, and the next build does not submit it again
    to a worker of that size."""
    from distributed import LocalCluster

    from neuron_build.build.builder import Builder
    from neuron_build.build.fleet.dask_executor import DaskBuild
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    cfg = write_sleepy_project(tmp_path / "p", batches=(1,))
    (cfg.parent / "sleepylib" / "hog.py").write_text(HOG_MODEL)
    cfg.write_text(cfg.read_text().replace('factory = "sleepylib.models:build"', 'factory = "sleepylib.hog:hog"')
                   .replace("kwargs = { seconds = 1.0 }", "kwargs = { mib = 800 }"))
    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = dask_env()["PYTHONPATH"]
    lines: list[str] = []
    try:
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, memory_limit="600MB",
                          dashboard_address=None, host="127.0.0.1") as lc:
            b = Builder(Workspace(load_project(cfg)))
            t0 = time.monotonic()
            out = DaskBuild(b.ws, lc.scheduler_address).run(b.ws.targets)["sleepy/b1/fp32/p1"]
            took = time.monotonic() - t0
            assert str(out.status) == "KILLED", out.reason
            m = re.match(r"out of memory: the compile's process tree reached (\d+) MiB \((\d+) bytes\), above the "
                         r"memory limit of Dask worker tcp://127\.0\.0\.1:\d+ \(--memory-limit\) of 572 MiB "
                         r"\(600000000 bytes\); stopped, and not retried on a worker of this size", out.reason)
            assert m, out.reason
            peak = int(m.group(2))
            assert peak > 600_000_000 and int(m.group(1)) == round(peak / 2**20)
            print(f"\nover-limit compile: limit 600000000 bytes (572 MiB), peak {peak} bytes "
                  f"({peak / 2**20:.0f} MiB), stopped after {took:.1f} s")
            fail = b.ws.store.failure("sleepy/b1/fp32/p1")
            assert fail is not None and fail.peak_rss_bytes == peak and str(fail.status) == "KILLED"
            assert len(calls(cfg.parent)) == 1
            again = DaskBuild(load_builder(cfg).ws, lc.scheduler_address, report=lines.append).run(b.ws.targets)
            out2 = again["sleepy/b1/fp32/p1"]
            assert str(out2.status) == "KILLED" and out2.reason.startswith(
                f"not retried: its last compile ran out of memory at {peak / 2**20:.0f} MiB ({peak} bytes) and the "
                f"largest Dask worker may use 572 MiB (600000000 bytes)"), out2.reason
            assert len(calls(cfg.parent)) == 1  # nothing compiled the second time
            assert any(ln.startswith("  FAILED sleepy/b1/fp32/p1: KILLED: not retried") for ln in lines)
    finally:
        if env_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = env_before


def load_builder(cfg: Path):
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace
    return Builder(Workspace(load_project(cfg)))
