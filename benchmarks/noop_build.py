"""No-op build time: `doit build` when every target is already in the store, against plain doit.

Cases, timed in the same run and interleaved (one run of each in turn, so load on the host hits both):
- **generated**: a matrix of 1,000 targets (one small model, 10 x 100 buckets). Its artifacts are written
  straight into the store with the same manifest the build writes, under the key ``plan`` computes, with
  recorded inputs as a real build records them (a weights file the factory read, a variable, a
  distribution), which every task checks (compiling 1,000 targets would take an hour and is not what is
  measured here: the no-op path never compiles);
- **plain_doit**: a dodo.py of 1,000 file tasks (each a `file_dep` and a `target`), all up to date: what
  doit itself costs for a no-op of the same size;
- **shipped** (with `--shipped`): the shipped matrix (build it first with `doit build`).

Each run is a fresh `python -c <doit main>` process; the script reports min / median wall seconds, checks
that no compile started and torch was never imported, and prints JSON with `generated.targets`,
`generated.median_s`, `generated.torch_imported`, `plain_doit.median_s` and `ratio` (generated over
plain doit, medians; the goal is at most 1.3), and `cpu_ratio`, the same over the processes' CPU seconds
(user + sys), which other load on a shared host disturbs less than wall time.

    .venv/bin/python benchmarks/noop_build.py [--runs 7] [--shipped]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GENERATED = '''
[build]
backend = "torchscript"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.gen]
factory = "genmodels.lin:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", "seq", 8] }]
buckets = { batch = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], seq = [SEQ] }
'''.replace("SEQ", ", ".join(str(i) for i in range(1, 101)))

# A doit run that reports whether torch got imported and how many tasks were up to date.
PROBE = r'''
import sys
from doit.doit_cmd import DoitMain
from doit.cmd_base import DodoTaskLoader
rc = DoitMain(DodoTaskLoader()).run(["build"])
print("RESULT", rc, "torch" in sys.modules, file=sys.stderr)
'''


def populate(cfg: Path) -> int:
    """Write a complete PASS artifact for every target of ``cfg`` into its store; returns the count."""
    import socket

    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.store.manifest import Manifest, Metrics
    from neuron_build.util import file_sha256
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    # what a build of the factory records besides its declared inputs (the worker's `imported` and `reads`)
    recorded = b.ws.keys.recorded_inputs("gen", [], {"files": ["genmodels/w.bin"], "env": ["GEN_SCALE"],
                                                     "dists": ["packaging"]})
    assert recorded["files"] and recorded["dists"]["packaging"], recorded
    for t in b.ws.targets:
        ki = b.ws.key(t)
        if b.ws.store.is_complete(ki.key):
            continue
        st = b.ws.store.new_staging(ki.key)
        obj = st / "object"
        obj.mkdir()
        (obj / "model.pt").write_bytes(b"placeholder artifact for the no-op benchmark " + ki.key.encode())
        files = {"model.pt": {"sha256": file_sha256(obj / "model.pt"), "size": (obj / "model.pt").stat().st_size}}
        m = Manifest(key=ki.key, target=t.id, model=t.model, bucket=dict(t.bucket), dtype=t.dtype,
                     profile=t.profile, backend=b.ws.keys.backend, hardware_target=b.ws.keys.hardware_target,
                     key_details=ki.details, component_hashes=ki.hashes, files=files,
                     metrics=Metrics(status="PASS", compile_time_s=0.001, op_count=1, op_count_source="benchmark"),
                     toolchain=ki.details["toolchain"], created="2026-01-01T00:00:00+00:00", host=socket.gethostname(),
                     recorded_inputs=recorded)
        b.ws.store.seal(obj, m)  # the manifest with its own digest, as the build writes it
        b.ws.store.publish(obj, ki.key)
        import shutil
        shutil.rmtree(st, ignore_errors=True)
    b.ws.keys.save()
    planned = Builder(Workspace(load_project(cfg)))  # what a fresh plan sees: every target cached, else the "no-op" compiles
    missing = [t.id for t in planned.ws.targets if planned.ws.state(t) != "cached"]
    if missing:
        raise SystemExit(f"{len(missing)} targets are not cached after populating (first: {missing[0]}): "
                         f"{planned.ws.changed(planned.ws.by_id[missing[0]])[0]}")
    return len(b.ws.targets)


PLAIN_DODO = '''
from pathlib import Path

DOIT_CONFIG = {"default_tasks": ["copy"], "verbosity": 2}


def _copy(src, dst):
    Path(dst).write_bytes(Path(src).read_bytes())


def task_copy():
    for i in range(N):
        yield {"name": f"f{i}", "actions": [(_copy, [f"in/{i}.txt", f"out/{i}.txt"])],
               "file_dep": [f"in/{i}.txt"], "targets": [f"out/{i}.txt"]}
'''


def plain_project(d: Path, n: int) -> None:
    """A plain doit project of ``n`` file tasks, built once (so the timed runs are no-ops)."""
    (d / "in").mkdir(parents=True)
    (d / "out").mkdir()
    for i in range(n):
        (d / "in" / f"{i}.txt").write_text(f"file {i}\n")
    (d / "dodo.py").write_text(PLAIN_DODO.replace("range(N)", f"range({n})"))
    p = subprocess.run([sys.executable, "-m", "doit"], cwd=d, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"plain doit build failed:\n{p.stderr[-2000:]}")


def run_once(folder: Path, task: str) -> tuple[float, dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # bytecode caches as a user's Python writes them: with PYTHONDONTWRITEBYTECODE set (as on some CI
    # images) every run would recompile this project's modules but not doit's installed, precompiled ones
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE.replace('["build"]', f'["{task}"]')], cwd=folder, env=env,
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("RESULT")]
    if p.returncode != 0 or not line:
        raise SystemExit(f"no-op build failed in {folder}:\n{p.stderr[-2000:]}")
    _, rc, torch_imported = line[-1].split()
    return wall, {"cpu_s": round(cpu, 3), "exit": int(rc), "torch_imported": torch_imported == "True",
                  "up_to_date": p.stdout.count(f"-- {task}:"), "ran": p.stdout.count(f".  {task}:")}


def summary(walls: list[float], cpus: list[float], last: dict) -> dict:
    last = {k: v for k, v in last.items() if k != "cpu_s"}
    return {"runs": len(walls), "min_s": round(min(walls), 3), "median_s": round(statistics.median(walls), 3),
            "median_cpu_s": round(statistics.median(cpus), 3), **last}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--shipped", action="store_true", help="also time the shipped matrix (built first)")
    args = ap.parse_args()
    results: dict = {"cpus": os.cpu_count()}

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "generated"
        (d / "genmodels").mkdir(parents=True)
        (d / "genmodels" / "__init__.py").write_text("")
        (d / "genmodels" / "lin.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 8)\n")
        (d / "genmodels" / "w.bin").write_bytes(b"\0" * 4096)
        (d / "buckets.toml").write_text(GENERATED)
        (d / "dodo.py").write_text("from neuron_build.tasks import *  # noqa\n")
        n = populate(d / "buckets.toml")
        plain = Path(tmp) / "plain"
        plain_project(plain, n)
        cases = {"generated": (d, "build"), "plain_doit": (plain, "copy")}
        if args.shipped:
            cases["shipped"] = (REPO, "build")
        walls: dict[str, list[float]] = {c: [] for c in cases}
        cpus: dict[str, list[float]] = {c: [] for c in cases}
        last: dict[str, dict] = {}
        for folder, task in cases.values():  # warm the file cache once, untimed
            run_once(folder, task)
        for _ in range(args.runs):
            for c, (folder, task) in cases.items():
                w, last[c] = run_once(folder, task)
                walls[c].append(w)
                cpus[c].append(last[c]["cpu_s"])
        for c in cases:
            results[c] = summary(walls[c], cpus[c], last[c])
            if last[c]["ran"]:
                raise SystemExit(f"{c}: {last[c]['ran']} tasks ran; the no-op must run none "
                                 f"(shipped: run `doit build` first)")
        results["generated"] = {"targets": n, **results["generated"]}
    results["ratio"] = round(results["generated"]["median_s"] / results["plain_doit"]["median_s"], 2)
    # CPU seconds (user + sys) of the doit processes: less sensitive to other load on a shared host
    results["cpu_ratio"] = round(results["generated"]["median_cpu_s"] / results["plain_doit"]["median_cpu_s"], 2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
