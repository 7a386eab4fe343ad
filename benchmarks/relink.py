"""A fine-tune (new weight values only) against the cold build, on inductor with ``weights = "external"``.

One tiny model (``Linear(8, H) -> ReLU -> Linear(H, 4)`` times a 0-d buffer) with 6 batch buckets, built
through the CLI in a fresh project: **cold** (every bucket compiled), then **fine-tune** (the factory's
``seed`` changes: same shapes, new values; every bucket relinked: the stored compiled files plus the new
weights file, nothing compiled). Each build is followed by ``validate`` (outputs against the eager model
with the new weights). Reported: wall seconds of each build and each validate, compiles and relinks
counted from the ledger (``report --json``), the ratio fine-tune / cold (build only and build + validate),
and the store's bytes: the weights blobs (one per weight values, shared by the 6 buckets) against the
compiled parts. Goal of issue 38: 0 compiles, and the fine-tune's wall time far below the cold build's.

    .venv/bin/python benchmarks/relink.py [--buckets 6] [--hidden 64] [--out benchmarks/results/relink.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, seed=0, hidden=64):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(8, hidden)
        self.fc2 = nn.Linear(hidden, 4)
        self.register_buffer("scale", 1.0 + torch.rand(()))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def build(seed=0, hidden=64):
    return Net(seed, hidden)
'''

CONFIG = '''
[build]
backend = "inductor"
timeout_s = 1800

[profiles.p1]
compiler_args = []
weights = "external"

[models.net]
factory = "ft.net:build"
kwargs = {{ seed = {seed}, hidden = {hidden} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 8] }}]
buckets = {{ batch = [{batches}] }}
'''


def _cli(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "neuron_build.cli", *args], capture_output=True, text=True,
                       cwd=str(REPO), timeout=7200)
    return time.monotonic() - t0, r


def _write(root: Path, seed: int, hidden: int, buckets: int) -> Path:
    (root / "ft").mkdir(parents=True, exist_ok=True)
    (root / "ft" / "__init__.py").write_text("")
    (root / "ft" / "net.py").write_text(MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(seed=seed, hidden=hidden,
                                                 batches=", ".join(str(b) for b in range(1, buckets + 1)))))
    return cfg


def _phase(cfg: Path) -> dict:
    def counts() -> dict:
        _, r = _cli("report", "--json", "-c", str(cfg))
        return json.loads(r.stdout)
    before = counts()
    build_s, b = _cli("build", "-c", str(cfg))
    if b.returncode != 0:
        raise SystemExit(f"build failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}")
    validate_s, v = _cli("validate", "-c", str(cfg))
    if v.returncode != 0:
        raise SystemExit(f"validate failed:\n{v.stdout[-3000:]}\n{v.stderr[-3000:]}")
    after = counts()
    return {"build_s": round(build_s, 2), "validate_s": round(validate_s, 2),
            "compiles": after["compiles"] - before["compiles"],
            "relinked": after["graph_reused"] - before["graph_reused"]}


def _store_bytes(cfg: Path) -> dict:
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    weights, compiled = {}, {}
    for t in b.ws.by_id.values():
        rec = b.store.target(t.id)
        m = b.store.manifest(rec.key) if rec else None
        for name, e in (m.files if m else {}).items():
            (weights if name == "weights.safetensors" else compiled)[e.sha256] = e.size
    return {"weights_blobs": len(weights), "weights_bytes": sum(weights.values()),
            "compiled_blobs": len(compiled), "compiled_bytes": sum(compiled.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="relink-bench-") as tmp:
        root = Path(tmp) / "proj"
        cfg = _write(root, 0, a.hidden, a.buckets)
        cold = _phase(cfg)
        _write(root, 7, a.hidden, a.buckets)
        fine = _phase(cfg)
        store = _store_bytes(cfg)
    out = {"buckets": a.buckets, "hidden": a.hidden, "cold": cold, "fine_tune": fine,
           "ratio_build": round(fine["build_s"] / cold["build_s"], 3),
           "ratio_build_validate": round((fine["build_s"] + fine["validate_s"]) /
                                         (cold["build_s"] + cold["validate_s"]), 3),
           "store_latest": store}
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
