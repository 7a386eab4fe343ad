"""Run the README's release flow N times in a row after one ``bench``, each time on fresh channels, and
print JSON: how many runs passed, and per run the latency gate's figures (median ratio and its interval).

Usage (in a checkout whose ``minilm`` targets are built, validated and benchmarked)::

    neuron-build build minilm && neuron-build validate minilm && neuron-build bench minilm --threads 1
    python benchmarks/release_flow_repeat.py [-c buckets.toml] [--runs 10]

Each run works on a copy of the project whose store shares the artifacts and results by hard links and
has no channels yet (so every run promotes into empty channels as a new user's first run does); the
copies are removed afterwards. A run passes when every command exits 0 and the pulled release serves.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVE = ('from neuron_build.runtime import BucketedModel; from models.minilm import tokenizer\n'
         'm = BucketedModel.load("serve/minilm"); enc = tokenizer()(["Hello.", "A longer sentence to embed."], '
         'padding=True, return_tensors="pt")\n'
         'print(m.choose([enc["input_ids"].shape] * 2), m(enc["input_ids"], enc["attention_mask"]).shape)')


def copy_project(src: Path, dest: Path) -> None:
    """``dest``: the project's files, its store hard-linked, without channels."""
    shutil.copytree(src.parent, dest, symlinks=True, copy_function=os.link,
                    ignore=shutil.ignore_patterns(".neuron-build", "channels", "__pycache__", ".git", "serve", "neuron_build", "tests",
                                                  ".venv"))


def run_flow(proj: Path) -> dict:
    cli = [sys.executable, "-m", "neuron_build.cli"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                       os.environ.get("PYTHONPATH", "")]))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], cwd=proj, env=env, text=True, capture_output=True)

    steps = []

    def step(name: str, *args: str) -> str | None:
        r = run(*args)
        steps.append({"command": name, "exit": r.returncode})
        if r.returncode != 0:
            raise RuntimeError(f"{name} exited {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
        return r.stdout

    latency = []
    try:
        rid = step("release fp32", "release", "minilm", "--dtype", "fp32", "-q").strip()
        step("promote R dev", "promote", "minilm", rid, "--to", "dev", "--reason", "fp32 baseline")
        step("promote dev staging", "promote", "minilm", "--from", "dev", "--to", "staging")
        step("promote staging prod", "promote", "minilm", "--from", "staging", "--to", "prod")
        bid = step("release bf16", "release", "minilm", "--dtype", "bf16", "-q").strip()
        for name, args in (("promote B dev", ["minilm", bid, "--to", "dev", "--reason", "bf16 candidate"]),
                           ("promote dev staging", ["minilm", "--from", "dev", "--to", "staging"]),
                           ("promote staging prod", ["minilm", "--from", "staging", "--to", "prod"])):
            out = json.loads(step(name, "promote", *args, "--json"))
            g = next(g for g in out["gates"] if g["name"] == "latency")
            latency.append({b: (r["ratio"], r["ratio_low"], r["ratio_high"]) for b, r in
                            g["figures"].get("buckets", {}).items()})
        step("rollback prod", "rollback", "minilm", "--channel", "prod", "--reason", "back to fp32")
        step("channels", "channels", "minilm")
        step("history", "history", "minilm", "--channel", "prod")
        step("pull", "pull", "minilm", "--channel", "prod", "--dest", "serve/minilm")
        r = subprocess.run([sys.executable, "-c", SERVE], cwd=proj, env=env, text=True, capture_output=True)
        steps.append({"command": "serve", "exit": r.returncode, "stdout": r.stdout.strip()})
        if r.returncode != 0 or "b8-s32 torch.Size([2, 9, 384])" not in r.stdout:
            raise RuntimeError(f"serve: {r.stdout.strip()} {r.stderr.strip()[-500:]}")
        return {"passed": True, "latency_ratios": latency, "steps": len(steps)}
    except RuntimeError as e:
        return {"passed": False, "error": str(e), "latency_ratios": latency, "steps": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", default="buckets.toml")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    cfg = Path(args.config).resolve()
    runs = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flow-", dir=cfg.parent.parent) as tmp:
        for i in range(args.runs):
            proj = Path(tmp) / f"run{i}"
            copy_project(cfg, proj)
            runs.append(run_flow(proj))
            shutil.rmtree(proj)
    print(json.dumps({"runs": len(runs), "passed": sum(r["passed"] for r in runs),
                      "seconds": round(time.monotonic() - t0, 1), "results": runs}, indent=2))
    return 0 if all(r["passed"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
