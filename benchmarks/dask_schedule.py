"""How well the Dask executor packs compiles onto workers.

1. **Fixed sleeps**: 40 targets whose compile is a fixed sleep (the Neuron test double's
   ``FAKE_NEURONX_CC_SLEEP``, backend ``neuron``) on 8 single-thread ``dask worker`` processes. The makespan
   (submission of the first task to the last result, and the whole ``neuron-build build`` command) is
   compared with the ideal, (sum of the recorded compile times) / workers. Goal: at most 1.15x.
2. **The shipped matrix** (``--shipped``): ``neuron-build build --executor dask`` on 2 workers against
   ``neuron-build build -n 2`` on this host, each into a fresh store.

Every process is real: ``dask scheduler`` and ``dask worker`` on 127.0.0.1 (see ``tests/helpers/daskkit.py``).
Prints one JSON object.

    .venv/bin/python benchmarks/dask_schedule.py [--targets 40] [--workers 8] [--sleep 10] [--shipped] [--no-sleeps]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fakes.env import neuron_env  # noqa: E402
from tests.helpers.daskkit import DaskCluster, dask_env  # noqa: E402

SLEEP_PROJECT = '''
[build]
backend = "neuron"
target = "trn1"
timeout_s = 600
transient_retries = 0

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.lin]
factory = "benchlib.lin:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 4] }}]
buckets = {{ batch = {batches} }}
'''

LIN = "import torch\n\ndef build():\n    torch.manual_seed(0)\n    return torch.nn.Linear(4, 4)\n"

CLIENT = r'''
import json, sys, time
t0 = time.monotonic()
from neuron_build.build.builder import Builder
from neuron_build.workspace import Workspace
from neuron_build.build.fleet.dask_executor import DaskBuild
from neuron_build.project.config import load_project
b = Builder(Workspace(load_project(sys.argv[1])))
t1 = time.monotonic()
out = DaskBuild(b.ws, sys.argv[2], connect_timeout_s=60).run(b.ws.targets)
t2 = time.monotonic()
times = {}
for t in b.ws.targets:
    m = b.ws.store.manifest(b.ws.key(t).key)
    times[t.id] = None if m is None else m.metrics.compile_time_s
print(json.dumps({"plan_s": t1 - t0, "run_s": t2 - t1, "total_s": t2 - t0,
                  "statuses": sorted({str(o.status) for o in out.values()}), "compile_times_s": times,
                  "workers": sorted({m.model_extra.get("worker") for t in b.ws.targets
                                     if (m := b.ws.store.manifest(b.ws.key(t).key)) is not None})}))
'''


def fixed_sleeps(tmp: Path, targets: int, workers: int, sleep: float) -> dict:
    proj = tmp / "sleeps"
    (proj / "benchlib").mkdir(parents=True)
    (proj / "benchlib" / "__init__.py").write_text("")
    (proj / "benchlib" / "lin.py").write_text(LIN)
    cfg = proj / "buckets.toml"
    cfg.write_text(SLEEP_PROJECT.format(batches=list(range(1, targets + 1))))
    env = dask_env(neuron_env("neuron_sdk", sleep=sleep))
    cluster = DaskCluster(tmp / "cluster", env=env)
    cluster.start_scheduler()
    try:
        for _ in range(workers):
            cluster.add_worker(wait=False)
        cluster.wait_workers(workers)
        r = subprocess.run([sys.executable, "-c", CLIENT, str(cfg), cluster.address], env=env, capture_output=True,
                           text=True, timeout=3600)
    finally:
        cluster.stop()
    if r.returncode != 0:
        raise SystemExit(f"the client failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    times = [t for t in res["compile_times_s"].values() if t is not None]
    ideal = sum(times) / workers
    return {"targets": targets, "workers": workers, "sleep_s": sleep, "statuses": res["statuses"],
            "built": len(times), "workers_used": len(res["workers"]),
            "compile_time_s": {"sum": round(sum(times), 2), "min": round(min(times), 2), "max": round(max(times), 2),
                               "mean": round(sum(times) / len(times), 2)},
            "ideal_s": round(ideal, 2), "makespan_s": round(res["run_s"], 2), "command_s": round(res["total_s"], 2),
            "ratio": round(res["run_s"] / ideal, 3), "ratio_command": round(res["total_s"] / ideal, 3),
            "goal": 1.15}


def shipped(tmp: Path) -> dict:
    out = {}
    for name in ("local_n2", "dask_2_workers"):
        proj = tmp / name
        proj.mkdir()
        shutil.copy(REPO / "buckets.toml", proj / "buckets.toml")
        shutil.copytree(REPO / "models", proj / "models", ignore=shutil.ignore_patterns("__pycache__"))
    env = dask_env()
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "neuron_build.cli", "-c", str(tmp / "local_n2" / "buckets.toml"),
                        "build", "-n", "2"], env=env, capture_output=True, text=True, timeout=3600)
    out["local_n2"] = {"wall_s": round(time.monotonic() - t0, 1), "rc": r.returncode,
                       "summary": _summary(r.stdout)}
    print(json.dumps({"partial": out}), file=sys.stderr, flush=True)  # kept if the second half is cut short
    cluster = DaskCluster(tmp / "cluster2", env=env)
    cluster.start_scheduler()
    try:
        cluster.add_worker(wait=False)
        cluster.add_worker(wait=False)
        cluster.wait_workers(2)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "neuron_build.cli", "-c", str(tmp / "dask_2_workers" / "buckets.toml"),
                            "build", "--executor", "dask", "--scheduler", cluster.address], env=env,
                           capture_output=True, text=True, timeout=3600)
        out["dask_2_workers"] = {"wall_s": round(time.monotonic() - t0, 1), "rc": r.returncode,
                                 "summary": _summary(r.stdout)}
    finally:
        cluster.stop()
    out["ratio_dask_over_local"] = round(out["dask_2_workers"]["wall_s"] / out["local_n2"]["wall_s"], 3)
    return out


def _summary(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if " targets: " in ln or ln.startswith("compiled on")]
    return " | ".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=40)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--sleep", type=float, default=10.0, help="fake compile time of each target, seconds")
    ap.add_argument("--shipped", action="store_true", help="also build the shipped matrix both ways (minutes)")
    ap.add_argument("--no-sleeps", action="store_true", help="skip the fixed-sleep part")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dask-bench-") as d:
        tmp = Path(d)
        result: dict = {"fixed_sleeps": "skipped (--no-sleeps)" if args.no_sleeps else
                        fixed_sleeps(tmp, args.targets, args.workers, args.sleep)}
        if args.shipped:
            result["shipped"] = shipped(tmp)
        else:
            result["shipped"] = "skipped (pass --shipped)"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
