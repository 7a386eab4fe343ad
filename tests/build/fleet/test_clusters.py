"""``[dask] cluster = "slurm"``: the schema, the scale rule, and a build through dask-jobqueue's ``SLURMCluster``
on a real one-node Slurm started on this host (the ``slurm`` fixture of ``tests/build/conftest.py``:
:class:`tests.helpers.slurm.LocalSlurm`, Debian's munged, slurmctld and slurmd as subprocesses).
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from neuron_build.build.fleet.clusters import scale_target, target_of_task, worker_args
from neuron_build.errors import ConfigError
from neuron_build.project.config import load_project
from neuron_build.project.config_dask import DaskSettings, walltime_seconds
from tests.helpers.cli import run_cli
from tests.helpers.daskkit import REPO, calls, dask_env, wait_for, write_sleepy_project


# -- the schema -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "seconds"), [("90", 5400), ("10:30", 630), ("01:30:00", 5400),
                                                ("2-00:00:00", 172800), ("1-12", 129600), ("1-00:10", 87000)])
def test_walltime_in_slurms_formats(text, seconds):
    assert walltime_seconds(text) == seconds


def test_lifetime_is_below_the_walltime_with_its_stagger():
    s = DaskSettings(cluster="slurm", walltime="01:00:00", memory="16GB", cores=4, processes=2)
    assert (s.walltime_s, s.margin_s, s.lifetime_s) == (3600, 360, 3240)
    args = worker_args(s)
    assert args[:4] == ["--lifetime", "3240s", "--lifetime-stagger", "90s"]  # latest stop: 3330 s < 3600 s
    assert args[4:] == ["--resources", "memory_gb=8.000"]  # each of the 2 worker processes gets half
    assert DaskSettings(cluster="slurm", walltime="12:00:00").margin_s == 900  # at most 15 minutes
    assert DaskSettings(cluster="slurm", walltime="00:05:00").lifetime_s == 240  # at least 60 s


def _config(tmp_path, dask: str):
    cfg = write_sleepy_project(tmp_path / "p", extra="\n[dask]\n" + dask)
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    return str(e.value)


@pytest.mark.parametrize(("dask", "says"), [
    ('cluster = "slurm"\nwalltime = "1h"', "dask.walltime: '1h' is not a Slurm time; write \"HH:MM:SS\""),
    ('cluster = "slurm"\nwalltime = "00:01:00"', "dask.walltime: '00:01:00' is under 120 s"),
    ('cluster = "slurm"\nmemory = "lots"', "dask.memory: 'lots' is not a memory size"),
    ('cluster = "slurm"\nminimum_jobs = 5\nmaximum_jobs = 2', "minimum_jobs (5) is above maximum_jobs (2)"),
    ('cluster = "slurm"\ncores = 1\nprocesses = 2', "processes (2) is above cores (1)"),
    ('cluster = "slurm"\nmaximum_jobs = true', "dask.maximum_jobs"),
    ('cluster = "pbs"', "dask.cluster"),
    ('queue = "compile"\nwalltime = "02:00:00"', 'dask: queue, walltime only apply to cluster = "slurm", and cluster is '
                                                 '"scheduler"; set cluster = "slurm" or remove them'),
    ('cluster = "slurm"\nqueues = "x"', "queues"),
    ('cluster = "slurm"\nmemory = "0GB"', "dask.memory: '0GB' is no memory"),
    ('cluster = "slurm"\nstart_timeout_s = inf', "dask.start_timeout_s"),
    ('cluster = "slurm"\ntarget_duration_s = inf', "dask.target_duration_s"),
])
def test_bad_dask_settings_are_one_line_naming_the_file_and_key(tmp_path, dask, says):
    msg = _config(tmp_path, dask)
    assert "buckets.toml" in msg and says in msg, msg


def test_slurm_without_the_dask_executor_is_refused(tmp_path):
    """``[dask] cluster = "slurm"`` with the local executor would be ignored: every compile on the submit host."""
    cfg = write_sleepy_project(tmp_path / "p", extra='\n[dask]\ncluster = "slurm"\n')
    with pytest.raises(ConfigError, match=r"dask.cluster: 'slurm' makes the workers of executor = \"dask\", but "
                                          r"\[build\] executor is 'local', so every compile would run on this host"):
        load_project(cfg)
    cfg.write_text(cfg.read_text().replace("[build]\n", '[build]\nexecutor = "dask"\n', 1))
    assert load_project(cfg).config.dask.cluster == "slurm"


def test_slurm_and_a_scheduler_address_are_refused_together(tmp_path):
    cfg = write_sleepy_project(tmp_path / "p", build_extra='scheduler = "tcp://x:8786"',
                               extra='\n[dask]\ncluster = "slurm"\n')
    with pytest.raises(ConfigError, match=r"dask.cluster: 'slurm' starts its own Dask scheduler, but \[build\] "
                                          r"scheduler is 'tcp://x:8786'; remove one of them"):
        load_project(cfg)


# -- the scale rule -----------------------------------------------------------------------------------------
def test_scale_target_follows_predicted_work_within_the_bounds():
    assert scale_target(100, 100 * 600.0, 8, 1800.0, 0, 50) == 5  # 60,000 s on 8 slots a job in 30 min
    assert scale_target(100, 100 * 600.0, 8, 1800.0, 0, 3) == 3  # the maximum
    assert scale_target(3, 3 * 36000.0, 8, 1800.0, 0, 50) == 1  # 3 compiles fill one job of 8 slots
    assert scale_target(1, 10.0, 1, 1800.0, 2, 4) == 2  # the minimum
    assert scale_target(0, 0.0, 1, 1800.0, 0, 4) == 0  # nothing to do: no job


def test_target_of_task_reads_the_executors_keys():
    assert target_of_task("neuron-build-m-1/b1-s128/fp32/o2-0123456789ab-deadbeef") == "m-1/b1-s128/fp32/o2"
    assert target_of_task("other-thing") is None and target_of_task(("tuple", 1)) is None


_RUNS: list[str] = []


def _compile_like(name: str, seconds: float) -> str:
    _RUNS.append(name)
    time.sleep(seconds)
    return name


def test_the_scaler_never_closes_a_worker_in_the_middle_of_a_compile():
    """Predicted work says one worker is enough while three run compiles: Dask's own choice would close two busy
    workers (their compiles start over elsewhere); the scaler closes none until they are idle."""
    from distributed import Client, LocalCluster, wait

    from neuron_build.build.fleet.clusters import make_adaptive

    settings = DaskSettings(cluster="slurm", cores=1, minimum_jobs=0, maximum_jobs=3)
    _RUNS.clear()
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        futures = [client.submit(_compile_like, f"t{i}", 4.0, key=f"neuron-build-m/b{i}/fp32/p1-0123456789ab-0000000{i}",
                                 pure=False) for i in range(3)]
        time.sleep(0.5)  # all three running, one per worker
        cluster.adapt(Adaptive=make_adaptive(settings, lambda tid: 1.0), minimum=0, maximum=3, interval="100ms",
                      wait_count=2)
        wait(futures, timeout=60)
        assert sorted(_RUNS) == ["t0", "t1", "t2"]  # each compile ran once: no busy worker was closed
        assert [f.result() for f in futures] == ["t0", "t1", "t2"]
        del futures
        end = time.monotonic() + 20
        while cluster.workers and time.monotonic() < end:  # idle and nothing left: scaled to the minimum
            time.sleep(0.2)
        assert not cluster.workers


@pytest.mark.parametrize(("predicted_s", "most_workers"), [(1.0, 1), (3600.0, 3)])
def test_the_scaler_asks_for_workers_from_the_predicted_work(predicted_s, most_workers):
    """Four pending compiles on one slot a worker: predicted at a second each, one worker finishes them well
    within target_duration_s; predicted at an hour each, the maximum of three."""
    from distributed import Client, LocalCluster, wait

    from neuron_build.build.fleet.clusters import make_adaptive

    settings = DaskSettings(cluster="slurm", cores=1, minimum_jobs=0, maximum_jobs=3, target_duration_s=1800)
    _RUNS.clear()
    seen = 0
    with LocalCluster(n_workers=0, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        cluster.adapt(Adaptive=make_adaptive(settings, lambda tid: predicted_s), minimum=0, maximum=3,
                      interval="100ms", wait_count=2)
        futures = [client.submit(_compile_like, f"t{i}", 1.0, key=f"neuron-build-m/b{i}/fp32/p1-0123456789ab-0000000{i}",
                                 pure=False) for i in range(4)]
        end = time.monotonic() + 60
        while not all(f.done() for f in futures) and time.monotonic() < end:
            seen = max(seen, len(cluster.scheduler.workers))
            time.sleep(0.05)
        wait(futures, timeout=1)
        assert sorted(_RUNS) == ["t0", "t1", "t2", "t3"]
    assert seen == most_workers


# -- a build on a real Slurm ------------------------------------------------------------------------------
SLURM_DASK = '''
[dask]
cluster = "slurm"
queue = "{queue}"
cores = 1
memory = "1GB"
walltime = "00:10:00"
minimum_jobs = 2
maximum_jobs = 2
scheduler_host = "127.0.0.1"
job_extra_directives = ["--job-name=nb-test"]
job_script_prologue = ["export NB_PROLOGUE_RAN=1"]
log_directory = "slurm-logs"
start_timeout_s = 120
'''


@pytest.mark.slow
def test_build_through_slurm_survives_a_cancelled_job_then_noop(slurm, tmp_path):
    import subprocess
    import sys

    cfg = write_sleepy_project(tmp_path / "p", seconds=6, batches=(1, 2, 3), build_extra='executor = "dask"',
                               extra=SLURM_DASK.format(queue=slurm.partition))
    env = slurm.env(dask_env())
    proc = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "-c", str(cfg), "build"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = wait_for(lambda: [c for c in calls(cfg.parent) if c["event"] == "start"], 180, "a compile")[0]
        job = slurm.job_of_pid(first["pid"])
        assert job is not None, "the compile runs inside a Slurm job"
        assert set(slurm.jobs()) >= {job}
        assert slurm.run("squeue", "-h", "-j", job, "-o", "%j").stdout.strip() == "nb-test"  # job_extra_directives
        assert psutil.Process(first["pid"]).environ().get("NB_PROLOGUE_RAN") == "1"  # job_script_prologue ran
        r = slurm.run("scancel", job)  # the worker's whole Slurm job, mid-compile
        assert r.returncode == 0, r.stderr
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err[-3000:]
    assert "3 targets: 3 built, 0 cached, 0 failed" in out, out
    starts = [c for c in calls(cfg.parent) if c["event"] == "start"]
    ends = [c for c in calls(cfg.parent) if c["event"] == "end"]
    per_key: dict[str, int] = {}
    for c in starts:
        per_key[c["key"]] = per_key.get(c["key"], 0) + 1
    assert sorted(per_key.values()) == [1, 1, 2], per_key  # the cancelled compile ran again, once
    assert per_key[first["key"]] == 2
    assert first["pid"] not in {c["pid"] for c in ends}  # it never finished in the cancelled job
    assert len(ends) == 3
    from neuron_build.build.builder import Builder
    from neuron_build.store.verify import verify_store
    from neuron_build.workspace import Workspace
    rerun = [c for c in starts if c["key"] == first["key"]][1]
    assert rerun["ppid"] != first["ppid"]  # on another worker (the other job, or the one Slurm ran in its place)
    b = Builder(Workspace(load_project(cfg)))
    for t in b.ws.targets:
        m = b.ws.store.manifest(b.ws.key(t).key)
        assert m is not None and m.metrics.status == "PASS", t.id
        assert m.model_dump(mode="json")["executor"] == "dask"
    rep = verify_store(b.ws.store, deep=True)
    assert rep.clean and rep.checked == 3, rep.to_json()  # nothing half-published
    # Slurm wrote the jobs' logs in log_directory: the two jobs, then the one asked for in the cancelled one's place
    assert len(list((cfg.parent / "slurm-logs").glob("neuron-build-*.err"))) == 3
    wait_for(lambda: not slurm.jobs(), 60, "the cluster's jobs to end after the build")
    again = run_cli("-c", str(cfg), "build", env=env, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 targets: 0 built, 3 cached, 0 failed" in again.stdout
    assert len([c for c in calls(cfg.parent) if c["event"] == "start"]) == 4  # the second build compiled nothing
    assert not slurm.jobs(), "a build with nothing to compile submits no Slurm job"
    assert os.environ.get("SLURM_CONF") != str(slurm.conf)


def test_a_worker_job_slurm_refuses_is_one_line_and_queues_nothing(slurm, tmp_path):
    cfg = write_sleepy_project(tmp_path / "p", seconds=0.1, batches=(1,), build_extra='executor = "dask"',
                               extra=SLURM_DASK.format(queue="no-such-queue"))
    r = run_cli("-c", str(cfg), "build", env=slurm.env(dask_env()), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    line = f'{cfg}: [dask] cluster = "slurm": Slurm refuses the worker job (sbatch: error: invalid partition specified: no-such-queue; allocation failure'
    assert line in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "fix [dask] queue, account, cores, memory, walltime or job_extra_directives" in r.stderr
    assert not slurm.jobs() and not calls(cfg.parent)


def test_without_sbatch_the_slurm_cluster_is_one_line(tmp_path):
    cfg = write_sleepy_project(tmp_path / "p", seconds=0.1, batches=(1,), build_extra='executor = "dask"',
                               extra=SLURM_DASK.format(queue="debug"))
    env = dask_env()
    env["PATH"] = os.path.dirname(os.path.realpath(os.sys.executable))  # python, no Slurm commands
    r = run_cli("-c", str(cfg), "build", env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f'{cfg}: [dask] cluster = "slurm" but sbatch is not on PATH; run the build on a Slurm submit host' \
        in r.stderr, r.stderr


def test_the_worker_job_carries_the_dask_settings(slurm, tmp_path, monkeypatch):
    from neuron_build.build.fleet.clusters import slurm_cluster

    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    settings = DaskSettings(cluster="slurm", queue=slurm.partition, cores=2, processes=1, memory="1GB",
                            walltime="00:10:00", job_extra_directives=("--job-name=nb-test",),
                            job_script_prologue=("export NB_PROLOGUE_RAN=1",), scheduler_host="127.0.0.1")
    cluster = slurm_cluster(settings, tmp_path, lambda tid: None, "buckets.toml")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ("#SBATCH -p debug", "#SBATCH --cpus-per-task=2", "#SBATCH -t 00:10:00", "#SBATCH --job-name=nb-test",
                 "export NB_PROLOGUE_RAN=1"):
        assert line in script, script
    # the worker leaves at most 540 + 15 s after it starts, before the 600 s walltime; 2 threads, 1 compile each
    assert "--lifetime 540s --lifetime-stagger 15s --resources memory_gb=1.000" in script, script
    assert "--nthreads 2" in script and "tcp://127.0.0.1:" in script, script
    assert not slurm.jobs()  # checking the job queued nothing


# -- docs/slurm-one-node.md on a real one-node Slurm ----------------------------------------------------------
PAGE = REPO / "docs" / "slurm-one-node.md"
#: slurm.conf keys whose values are this host's files or ports: the helper keeps them in its scratch folder
_PLACES = {"StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile",
           "SlurmdLogFile", "SlurmctldPort", "SlurmdPort", "AuthInfo", "ClusterName"}


def _blocks(lang: str) -> list[str]:
    import re
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), flags=re.S)


def _conf(text: str) -> dict[str, str]:
    """slurm.conf lines as key -> value (a node or partition line: its name -> the rest)."""
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("cat ", "EOF", "mkdir")):
            k, _, v = line.strip().partition("=")
            out[k] = v
    return {k: v for k, v in out.items() if k not in _PLACES}


def test_the_slurm_page_uses_the_helpers_slurm_conf(slurm):
    """The page's slurm.conf is the one the test helper runs (this host's files and ports aside), with the
    host's name and CPUs where the page writes $(hostname) and $(nproc), and the packages it installs."""
    from tests.helpers.slurm import CONF

    page = next(b for b in _blocks("sh") if "slurm.conf <<EOF" in b)
    page = page.replace("$(hostname)", slurm.host).replace("$(nproc)", str(slurm.cpus))
    ours = _conf(slurm.conf.read_text())
    theirs = _conf(page)
    ours["NodeName"] = ours["NodeName"].replace(ours["NodeName"].split("RealMemory=")[1].split()[0], "4096")
    assert theirs == ours
    assert set(_conf(CONF)) == set(ours)
    assert "apt-get install -y slurmctld slurmd slurm-client munge" in _blocks("sh")[0]


def test_the_slurm_page_builds_from_zero_jobs(slurm, tmp_path):
    """The page's [dask] table (minimum_jobs = 0) on a real one-node Slurm: the build submits a job as soon as
    it has something to compile and builds (before: no sbatch ever ran, and the build waited start_timeout_s
    for a worker); a no-op build then submits none."""
    import tomllib

    page = tomllib.loads(next(b for b in _blocks("toml") if "[dask]" in b))
    assert page["build"] == {"executor": "dask"} and page["dask"]["minimum_jobs"] == 0
    dask = "\n[dask]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in page["dask"].items()) + "start_timeout_s = 90\n"
    cfg = write_sleepy_project(tmp_path / "p", seconds=0.5, batches=(1,), build_extra='executor = "dask"', extra=dask)
    env = slurm.env(dask_env())
    t0 = time.monotonic()
    r = run_cli("-c", str(cfg), "build", env=env, timeout=240)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout, r.stdout
    assert len(list((cfg.parent / "slurm-logs").glob("neuron-build-*.err"))) == 1  # one job, sbatch'ed by the build
    assert took < 80, took
    wait_for(lambda: not slurm.jobs(), 60, "the job to end after the build")
    again = run_cli("-c", str(cfg), "build", env=env, timeout=120)
    assert "1 target: 0 built, 1 cached, 0 failed" in again.stdout, again.stdout + again.stderr
    assert len(list((cfg.parent / "slurm-logs").glob("neuron-build-*.err"))) == 1 and not slurm.jobs()


def _toml(v) -> str:
    import json
    return json.dumps(v) if isinstance(v, (str, list)) else str(v)


@pytest.mark.parametrize(("edit", "says"), [
    (('["--job-name=nb-test"]', '["--hold"]'),
     "is PENDING (JobHeldUser), which does not end by itself; release it (scontrol release "),
    (('["export NB_PROLOGUE_RAN=1"]', '["echo the prologue failed >&2; exit 3"]'),
     "ended before its worker connected; read its log "),
])
def test_a_slurm_job_that_cannot_give_a_worker_is_one_line_within_scheduler_timeout_s(slurm, tmp_path, edit, says):
    """A worker job Slurm holds (--hold: pending with reason JobHeldUser, forever), or one that ends before its
    worker starts (a failing prologue): the build stops within scheduler_timeout_s with the job, its state and
    reason or its log, and the fix, not after start_timeout_s."""
    extra = SLURM_DASK.format(queue=slurm.partition).replace(*edit)
    extra = extra.replace("minimum_jobs = 2", "minimum_jobs = 0").replace("start_timeout_s = 120", "start_timeout_s = 300")
    cfg = write_sleepy_project(tmp_path / "p", seconds=0.1, batches=(1,),
                               build_extra='executor = "dask"\nscheduler_timeout_s = 3', extra=extra)
    t0 = time.monotonic()
    r = run_cli("-c", str(cfg), "build", env=slurm.env(dask_env()), timeout=200)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f'{cfg}: [dask] cluster = "slurm": no Dask worker joined tcp://127.0.0.1:' in lines[0], lines[0]
    assert says in lines[0], lines[0]
    log = lines[0].split(str(cfg.parent / "slurm-logs") + "/")[1].split(".err")[0] + ".err"
    assert log.startswith("neuron-build-"), lines[0]
    if "prologue" in edit[1]:
        assert "the prologue failed" in (cfg.parent / "slurm-logs" / log).read_text()
    assert took < 60, took
    wait_for(lambda: not slurm.jobs(), 30, "the job to be cancelled")
    assert not calls(cfg.parent)
