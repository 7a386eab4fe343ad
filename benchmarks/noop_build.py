"""No-op build time: `doit build` when every target is already in the store.

Two cases:
- the shipped matrix (build it first with `doit build`; this script refuses if it is not built);
- a generated matrix of 1,000 targets (one small model, 10 x 100 buckets). Its artifacts are written
  straight into the store with the same manifest the build writes (compiling 1,000 targets would take
  an hour and is not what is measured here: the no-op path never compiles).

Each case runs `python -m doit build` N times in a fresh process and reports min / median wall seconds,
and checks that no compile started and torch was never imported.

    .venv/bin/python benchmarks/noop_build.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
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

    b = Builder(load_project(cfg))
    for t in b.targets:
        ki = b.key(t)
        if b.store.is_complete(ki.key):
            continue
        st = b.store.new_staging(ki.key)
        obj = st / "object"
        obj.mkdir()
        (obj / "model.pt").write_bytes(b"placeholder artifact for the no-op benchmark " + ki.key.encode())
        files = {"model.pt": {"sha256": file_sha256(obj / "model.pt"), "size": (obj / "model.pt").stat().st_size}}
        m = Manifest(key=ki.key, target=t.id, model=t.model, bucket=dict(t.bucket), dtype=t.dtype,
                     profile=t.profile, backend=b.keys.backend, hardware_target=b.keys.hardware_target,
                     key_details=ki.details, component_hashes=ki.hashes, files=files,
                     metrics=Metrics(status="PASS", compile_time_s=0.001, op_count=1, op_count_source="benchmark"),
                     toolchain=ki.details["toolchain"], created="2026-01-01T00:00:00+00:00", host=socket.gethostname())
        (obj / "manifest.json").write_text(m.to_json_text())
        b.store.publish(obj, ki.key)
        import shutil
        shutil.rmtree(st, ignore_errors=True)
    b.keys.save()
    return len(b.targets)


def time_noop(folder: Path, runs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    walls, last = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", PROBE], cwd=folder, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        line = [ln for ln in p.stderr.splitlines() if ln.startswith("RESULT")]
        if p.returncode != 0 or not line:
            raise SystemExit(f"no-op build failed in {folder}:\n{p.stderr[-2000:]}")
        _, rc, torch_imported = line[-1].split()
        last = {"exit": int(rc), "torch_imported": torch_imported == "True",
                "up_to_date": p.stdout.count("-- build:"), "ran": p.stdout.count(".  build:")}
    return {"runs": runs, "min_s": round(min(walls), 3), "median_s": round(statistics.median(walls), 3), **last}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    results = {"cpus": os.cpu_count()}

    shipped = time_noop(REPO, args.runs)
    if shipped["ran"]:
        raise SystemExit("the shipped matrix is not fully built; run `doit build` first")
    results["shipped"] = shipped

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "genmodels").mkdir()
        (d / "genmodels" / "__init__.py").write_text("")
        (d / "genmodels" / "lin.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 8)\n")
        (d / "buckets.toml").write_text(GENERATED)
        (d / "dodo.py").write_text("from neuron_build.tasks import *  # noqa\n")
        n = populate(d / "buckets.toml")
        results["generated"] = {"targets": n, **time_noop(d, args.runs)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
