"""Weights once (issue 38, item 3): store bytes, serving RSS and latency of ``weights = "external"`` against
``"inline"`` on inductor (AOTInductor), one model with N batch buckets.

The model: ``--layers`` ``Linear(H, H)`` (H = ``--hidden``) with ReLU between them, times a 0-d buffer
(fp32; 4 x 2048 x 2048 is 64 MiB of weights, big enough for RSS to show). Two fresh projects, one per
weights mode, are built through the CLI (every bucket compiled), released, promoted (unvalidated) and
pulled, as a deploy host does. Then, each in a fresh process:

- **store**: bytes of the blobs the N artifacts reference (each blob once: the store is content-addressed)
  and of the whole ``cas/`` folder, against the goal ``weights + N x compiled part + 5%`` (compiled part:
  every file of an artifact but ``weights.safetensors``); the pulled release's bytes on disk (hard links
  counted once).
- **rss**: ``BucketedModel.load`` of the pulled release with 1 bucket and with all N (the 1-bucket folder is
  the same files, hard-linked, with a ``release.json`` of its first bucket), one call per bucket; peak RSS
  (``VmHWM``) and RSS after, minus the RSS after ``import torch`` (the baseline, also given).
- **latency**: both releases loaded in one process, calls interleaved (inline, external, external, inline,
  ...) per bucket after a warm-up; median and p90 per call, the ratio external / inline, and its geometric
  mean over the buckets.

``--keep DIR`` builds there and keeps it; a second run with the same folder reuses the stores (its
``build_s`` is then a no-op build's).

TorchScript has no external-weights mode (``torch.jit.trace`` keeps the weights as module attributes in the
one archive; the ``weights`` option applies to inductor, neuron and text generation): not measured.

    .venv/bin/python benchmarks/weights_once.py [--buckets 6] [--hidden 2048] [--layers 4] [--rounds 60]
        [--threads 1] [--out benchmarks/results/weights_once.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
    def __init__(self, hidden=2048, layers=4):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.register_buffer("scale", 1.0 + torch.rand(()))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(torch.relu(x))
        return x * self.scale


def build(hidden=2048, layers=4):
    return Net(hidden, layers)
'''

CONFIG = '''
[build]
backend = "inductor"
timeout_s = 3600

[profiles.p1]
compiler_args = []
weights = "{weights}"

[release]
max_artifacts_per_model = {buckets}

[models.net]
factory = "wo.net:build"
kwargs = {{ hidden = {hidden}, layers = {layers} }}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", {hidden}] }}]
buckets = {{ batch = [{batches}] }}
'''


def _cli(cfg: Path, *args: str, fine: str | None = None) -> tuple[float, str]:
    """Run ``neuron-build ARGS -c cfg``: (seconds, stdout); an error (unless its output holds ``fine``) ends."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "neuron_build.cli", *args, "-c", str(cfg)], capture_output=True,
                       text=True, cwd=str(cfg.parent), timeout=7200)
    if r.returncode != 0 and not (fine and fine in r.stdout + r.stderr):
        raise SystemExit(f"neuron-build {' '.join(args)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return time.monotonic() - t0, r.stdout


def _project(root: Path, weights: str, a: argparse.Namespace) -> dict:
    """Build, release, promote and pull one project; its figures and the pulled folder."""
    (root / "wo").mkdir(parents=True, exist_ok=True)  # --keep: a second run reuses the built store
    (root / "wo" / "__init__.py").write_text("")
    (root / "wo" / "net.py").write_text(MODEL)
    cfg = root / "buckets.toml"
    batches = ", ".join(str(2 ** i) for i in range(a.buckets))
    cfg.write_text(textwrap.dedent(CONFIG.format(weights=weights, hidden=a.hidden, layers=a.layers, batches=batches,
                                                 buckets=a.buckets)))
    build_s, _ = _cli(cfg, "build")
    rel = json.loads(_cli(cfg, "release", "net", "--json")[1])
    _cli(cfg, "promote", "net", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "benchmark",
         fine="already holds")  # --keep: promoted by the first run
    dest = root.parent / f"serve-{weights}"
    _cli(cfg, "pull", "net", "--channel", "dev", "--dest", str(dest))
    return {"build_s": round(build_s, 1), "store": _store_bytes(cfg), "pulled_bytes": _disk_bytes(dest),
            "dest": dest}


def _store_bytes(cfg: Path) -> dict:
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    b = Workspace(load_project(cfg))
    weights, compiled, per_artifact = {}, {}, []
    for t in b.by_id.values():
        rec = b.store.target(t.id)
        m = b.store.manifest(rec.key)
        part = 0
        for name, e in m.files.items():
            if name == "weights.safetensors":
                weights[e.sha256] = e.size
            else:
                compiled[e.sha256] = e.size
                part += e.size
        per_artifact.append(part)
    cas = Path(b.store.root) / "cas"
    out = {"weights_blobs": len(weights), "weights_bytes": sum(weights.values()), "compiled_blobs": len(compiled),
           "compiled_bytes": sum(compiled.values()), "cas_bytes": _disk_bytes(cas)}
    out["referenced_bytes"] = out["weights_bytes"] + out["compiled_bytes"]
    if weights:
        one = max(weights.values())
        out["goal_bytes"] = round((one + len(per_artifact) * max(per_artifact)) * 1.05)
        out["within_goal"] = out["cas_bytes"] <= out["goal_bytes"]
    return out


def _disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder``, each inode once (hard links are one file on disk)."""
    seen, total = set(), 0
    for p in folder.rglob("*"):
        if p.is_file() and not p.is_symlink():
            st = p.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _first_bucket_only(dest: Path, out: Path) -> Path:
    """A copy of pulled folder ``dest`` (hard links) whose ``release.json`` lists its first bucket only."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(dest, out, copy_function=os.link)
    rel = json.loads((out / "release.json").read_text())
    rel["buckets"] = rel["buckets"][:1]
    (out / "release.json").unlink()  # a hard link of the pulled one: write a new file, never through it
    (out / "release.json").write_text(json.dumps(rel))
    return out


# -- measured in fresh processes ----------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _rss_child(folder: str, threads: int) -> dict:
    import torch

    from neuron_build.runtime import BucketedModel

    torch.set_num_threads(threads)
    base = _status_kib("VmRSS")
    t0 = time.monotonic()
    bm = BucketedModel.load(folder, verify="size")
    load_s = time.monotonic() - t0
    for b in bm.buckets:
        bm(torch.randn(*b.inputs[0]["shape"]))
    mib = 1024.0
    return {"buckets": len(bm.buckets), "baseline_mib": round(base / mib, 1),
            "peak_mib": round(_status_kib("VmHWM") / mib, 1), "after_mib": round(_status_kib("VmRSS") / mib, 1),
            "peak_over_baseline_mib": round((_status_kib("VmHWM") - base) / mib, 1),
            "after_over_baseline_mib": round((_status_kib("VmRSS") - base) / mib, 1),
            "weights_held_mib": round(bm.weights.nbytes() / 2 ** 20, 1) if bm.weights else 0.0,
            "load_s": round(load_s, 2)}


def _latency_child(inline: str, external: str, rounds: int, threads: int) -> dict:
    import torch

    from neuron_build.runtime import BucketedModel

    torch.set_num_threads(threads)
    models = {"inline": BucketedModel.load(inline, verify="size"),
              "external": BucketedModel.load(external, verify="size")}
    out = {}
    for b in models["inline"].buckets:
        x = torch.randn(*b.inputs[0]["shape"])
        assert torch.allclose(models["inline"](x), models["external"](x), rtol=1e-4, atol=1e-4)
        for _ in range(5):
            for m in models.values():
                m(x)
        times: dict[str, list[float]] = {"inline": [], "external": []}
        for r in range(rounds):
            for name in (("inline", "external") if r % 2 == 0 else ("external", "inline")):
                t0 = time.perf_counter()
                models[name](x)
                times[name].append(time.perf_counter() - t0)
        row = {}
        for name, ts in times.items():
            ts.sort()
            row[f"{name}_median_ms"] = round(statistics.median(ts) * 1e3, 3)
            row[f"{name}_p90_ms"] = round(ts[int(0.9 * (len(ts) - 1))] * 1e3, 3)
        row["external_over_inline"] = round(row["external_median_ms"] / row["inline_median_ms"], 3)
        out[b.id] = row
    ratios = [r["external_over_inline"] for r in out.values()]
    out["geomean_external_over_inline"] = round(statistics.geometric_mean(ratios), 3)
    return out


def _child(*args: str) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                       cwd=str(REPO), timeout=7200)
    if r.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buckets", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the measuring processes")
    ap.add_argument("--keep", default=None, help="build into this folder and keep it (default: a temporary one)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        res = (_rss_child(rest[0], int(rest[1])) if kind == "rss"
               else _latency_child(rest[0], rest[1], int(rest[2]), int(rest[3])))
        print(json.dumps(res))
        return
    tmp = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="weights-once-"))
    try:
        projects = {w: _project(tmp / f"proj-{w}", w, a) for w in ("inline", "external")}
        rss = {}
        for w, p in projects.items():
            one = _first_bucket_only(p["dest"], tmp / f"serve-{w}-1")
            rss[w] = {"N=1": _child("rss", str(one), str(a.threads)),
                      f"N={a.buckets}": _child("rss", str(p["dest"]), str(a.threads))}
        latency = _child("latency", str(projects["inline"]["dest"]), str(projects["external"]["dest"]),
                         str(a.rounds), str(a.threads))
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    out = {"buckets": a.buckets, "hidden": a.hidden, "layers": a.layers, "threads": a.threads,
           "weights_mib": round((a.hidden * a.hidden + a.hidden) * a.layers * 4 / 2 ** 20, 1),
           "build": {w: {k: v for k, v in p.items() if k != "dest"} for w, p in projects.items()},
           "rss": rss, "latency": latency}
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
