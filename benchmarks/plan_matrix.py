"""Plan time of a 10,000-target matrix: unchanged, and right after a bucket-list change.

A generated project (one small model, 100 x 100 buckets = 10,000 targets, torchscript backend) gets a
target record for every target (what a build leaves behind; no artifacts are needed: the plan only reads
records and looks keys up). Then `neuron-build plan --json` runs in a fresh process:

- **unchanged**: every target has its own record (its key is compared with its last build);
- **changed**: the `seq` bucket list is replaced by 100 other sizes, so all 10,000 targets are new and
  each is explained against the most similar of the 10,000 removed ones (the case that grew quadratically
  before the removed targets were indexed: 400 x 400 buckets took 24 s).

The goal: changed / unchanged <= 2.

    .venv/bin/python benchmarks/plan_matrix.py [--runs 3] [--batch 100] [--seq 100]
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

CONFIG = '''
[build]
backend = "torchscript"

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.gen]
factory = "genmodels.lin:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", "seq", 8] }]
buckets = { batch = [BATCH], seq = [SEQ] }
'''


def write_config(cfg: Path, batch: range, seq: range) -> None:
    cfg.write_text(CONFIG.replace("BATCH", ", ".join(map(str, batch))).replace("SEQ", ", ".join(map(str, seq))))


def record_all(cfg: Path) -> int:
    """Write a PASS target record for every target of ``cfg`` (its current key and details)."""
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.store.records import TargetRecord
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    for t in b.ws.targets:
        ki = b.ws.key(t)
        b.ws.store.put_target(TargetRecord(target=t.id, key=ki.key, status="PASS", details=ki.details,
                                           hashes=ki.hashes, time="2026-01-01T00:00:00+00:00"))
    b.ws.keys.save()
    return len(b.ws.targets)


def time_plan(cfg: Path, runs: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    walls, rows = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "neuron_build.cli", "plan", "--json", "-c", str(cfg)],
                           env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise SystemExit(f"plan failed:\n{p.stderr[-2000:]}")
        rows = json.loads(p.stdout)["targets"]  # plan --json: {"schema", "targets": [...]}
    states: dict[str, int] = {}
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    compared = sum(1 for r in rows if r.get("compared_with"))
    return {"runs": runs, "min_s": round(min(walls), 3), "median_s": round(statistics.median(walls), 3),
            "targets": len(rows), "states": states, "compared_with_removed": compared,
            "sample": rows[0]["changed_detail"] if rows else []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=100, help="batch bucket values")
    ap.add_argument("--seq", type=int, default=100, help="seq bucket values")
    args = ap.parse_args()
    out: dict = {"cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "genmodels").mkdir()
        (d / "genmodels" / "__init__.py").write_text("")
        (d / "genmodels" / "lin.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(8, 8)\n")
        cfg = d / "buckets.toml"
        write_config(cfg, range(1, args.batch + 1), range(1, args.seq + 1))
        t0 = time.perf_counter()
        n = record_all(cfg)
        out["setup_s"] = round(time.perf_counter() - t0, 1)
        out["targets"] = n
        out["unchanged"] = time_plan(cfg, args.runs)
        write_config(cfg, range(1, args.batch + 1), range(args.seq + 1, 2 * args.seq + 1))
        out["changed"] = time_plan(cfg, args.runs)
    out["ratio"] = round(out["changed"]["median_s"] / out["unchanged"]["median_s"], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
