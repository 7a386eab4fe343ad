"""A fine-tune (new weight values only) against the cold build, on inductor with ``weights = "external"``.

One tiny model (``Linear(8, H) -> ReLU -> Linear(H, 4)`` times a 0-d buffer) with 6 batch buckets, built
through the CLI in a fresh project: **cold** (every bucket compiled), then **fine-tune** (the factory's
``seed`` changes: same shapes, new values; every bucket relinked: the stored compiled files plus the new
weights file, nothing compiled). Each build is followed by ``validate`` (outputs against the eager model
with the new weights). Reported: wall seconds of each build and each validate, compiles and relinks
counted from the ledger (``report --json``), the ratio fine-tune / cold (build only and build + validate),
and the store's bytes: the weights blobs (one per weight values, shared by the 6 buckets) against the
compiled parts. Goal of issue 38: 0 compiles, and the fine-tune's wall time far below the cold build's.

``--backend neuron`` runs the same on the XLA path (``weights = "external"`` is ``inline_weights_to_neff =
false``) and also counts **neuronx-cc runs** (``neuronx_cc_runs``): without the Neuron toolchain the test
double in ``tests/fakes`` stands in (by path, as :mod:`edit_replay` puts it; its neuronx-cc writes one line
per run into its ``calls`` file and compiles in well under a second unless ``--cc-sleep`` says otherwise).

The NxDI row (``--backend nxdi``; against the NxDI double in tests/fakes/nxdi unless the real packages are
installed): a tiny Llama checkpoint (transformers, random weights) on ``backend = "neuron"``, tp_degree 2, 3
context-encoding and 3 token-generation buckets (6 NEFFs), the double's neuronx-cc taking ``--cc-sleep`` seconds
per NEFF. Cold build, then a fine-tune (the checkpoint saved again from another seed: same config and tensors)
relinked: NxDI's ``shard_weights`` only, no ``compile()`` (no trace) and no neuronx-cc run; then, for
comparison, another fine-tune with the graph key off (``NEURON_BUILD_GRAPH_KEY=0``): NxDI's ``compile()``
again, its NEFFs from the persistent cache the store owns. No validate (no NeuronCore here).

The **text-generation** row (``--backend textgen``, :func:`textgen_row`): a tiny Llama (transformers' code, random weights
saved as an hf folder, ``weights = "external"``), batch buckets 1 and 2 and prefill buckets 8 and 16 (6
graphs: 4 prefill, 2 decode), cold then fine-tuned (the same config, other random weights): 0 graphs
compiled, and ``validate`` (generate against eager ``generate`` of the fine-tuned model) passes on the
relinked graphs.

    .venv/bin/python benchmarks/relink.py [--backend inductor|neuron|nxdi|textgen] [--buckets 6] [--hidden 64]
        [--cc-sleep S] [--out benchmarks/results/relink.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))  # edit_replay's Neuron double environment

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
backend = "{backend}"
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


def _cli(*args: str, env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "neuron_build.cli", *args], capture_output=True, text=True,
                       cwd=str(REPO), timeout=7200, env={**os.environ, **(env or {})})
    return time.monotonic() - t0, r


def _write(root: Path, seed: int, hidden: int, buckets: int, backend: str = "inductor") -> Path:
    (root / "ft").mkdir(parents=True, exist_ok=True)
    (root / "ft" / "__init__.py").write_text("")
    (root / "ft" / "net.py").write_text(MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG.format(seed=seed, hidden=hidden, backend=backend,
                                                 batches=", ".join(str(b) for b in range(1, buckets + 1)))))
    return cfg


def _phase(cfg: Path, env: dict | None = None) -> dict:
    from edit_replay import cc_runs

    def counts() -> dict:
        _, r = _cli("report", "--json", "-c", str(cfg), env=env)
        return json.loads(r.stdout)
    before, runs = counts(), cc_runs(env or {})
    build_s, b = _cli("build", "-c", str(cfg), env=env)
    if b.returncode != 0:
        raise SystemExit(f"build failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}")
    validate_s, v = _cli("validate", "-c", str(cfg), env=env)
    if v.returncode != 0:
        raise SystemExit(f"validate failed:\n{v.stdout[-3000:]}\n{v.stderr[-3000:]}")
    after = counts()
    out = {"build_s": round(build_s, 2), "validate_s": round(validate_s, 2),
           "compiles": after["compiles"] - before["compiles"],
           "relinked": after["graph_reused"] - before["graph_reused"]}
    if runs is not None:
        out["neuronx_cc_runs"] = cc_runs(env) - runs
    return out


def _neuron_env(tmp: Path, cc_sleep: float) -> dict:
    """The Neuron double's environment (with its neuronx-cc calls file), or {} with the real toolchain."""
    from edit_replay import _real_neuron, neuron_double_env

    if _real_neuron():
        return {}
    env = neuron_double_env(tmp / "neuronx-cc-calls.jsonl")
    if cc_sleep:
        env["FAKE_NEURONX_CC_SLEEP"] = str(cc_sleep)
    return env


def _store_bytes(cfg: Path) -> dict:
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    b = Builder(Workspace(load_project(cfg)))
    weights, compiled = {}, {}
    for t in b.ws.by_id.values():
        rec = b.ws.store.target(t.id)
        m = b.ws.store.manifest(rec.key) if rec else None
        for name, e in (m.files if m else {}).items():
            (weights if name == "weights.safetensors" else compiled)[e.sha256] = e.size
    return {"weights_blobs": len(weights), "weights_bytes": sum(weights.values()),
            "compiled_blobs": len(compiled), "compiled_bytes": sum(compiled.values())}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _nxdi_phase(cfg: Path, env: dict) -> dict:
    """One NxDI build: wall seconds, neuronx-cc runs, NxDI compile() and shard_weights calls, ledger counts."""
    cc, nx = Path(env["FAKE_NEURONX_CC_CALLS"]), Path(env["FAKE_NXDI_CALLS"])
    n_cc, n_nx = _lines(cc), _lines(nx)
    _, r = _cli("report", "--json", "-c", str(cfg), env=env)
    before = json.loads(r.stdout)
    build_s, b = _cli("build", "-c", str(cfg), env=env)
    if b.returncode != 0:
        raise SystemExit(f"NxDI build failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}")
    _, r = _cli("report", "--json", "-c", str(cfg), env=env)
    after = json.loads(r.stdout)
    calls = [json.loads(x)["call"] for x in nx.read_text().splitlines()[n_nx:]] if nx.exists() else []
    _, r = _cli("show", "llama/nxdi-b1/bf16/p1", "--json", "-c", str(cfg), env=env)
    m = json.loads(r.stdout)
    m = m.get("manifest", m)
    return {"build_s": round(build_s, 2), "worker_s": m["metrics"]["compile_time_s"], "neuronx_cc_runs": _lines(cc) - n_cc,
            "nxdi_compile_calls": calls.count("compile"), "nxdi_shard_calls": calls.count("shard_weights"),
            "compiles": after["compiles"] - before["compiles"], "relinked": after["graph_reused"] - before["graph_reused"]}


def nxdi(tmp: Path, cc_sleep: float) -> dict:
    """The NxDI row (see the module docstring)."""
    from tests.helpers.textgen import save_llama_checkpoint, write_project

    fakes = REPO / "tests" / "fakes"
    root = tmp / "nxdi"
    cfg = write_project(root, backend="neuron", gpt2=False, llama_buckets="{ batch = [1], seq = [8, 16, 32] }",
                        extra="decode_buckets = [32, 48, 64]")  # (a checkpoint of seed 0)
    text = cfg.read_text().replace('device = "cpu"', 'target = "trn1"').replace('dtypes = ["fp32"]', 'dtypes = ["bf16"]')
    cfg.write_text(text.replace("compiler_args = []", "compiler_args = []\ntp_degree = 2"))
    env = {"PYTHONPATH": os.pathsep.join([str(fakes / "nxdi"), str(fakes / "neuron_sdk"), str(REPO)]),
           "PATH": os.pathsep.join([str(fakes / "bin"), os.environ.get("PATH", "")]), "FAKE_NEURON_PYTHON": sys.executable,
           "FAKE_NEURONX_CC_CALLS": str(tmp / "cc-calls.jsonl"), "FAKE_NXDI_CALLS": str(tmp / "nxdi-calls.jsonl"),
           "FAKE_NEURONX_CC_SLEEP": str(cc_sleep)}
    cold = _nxdi_phase(cfg, env)
    save_llama_checkpoint(root / "hf-llama", seed=1)
    fine = _nxdi_phase(cfg, env)
    save_llama_checkpoint(root / "hf-llama", seed=2)
    off = _nxdi_phase(cfg, {**env, "NEURON_BUILD_GRAPH_KEY": "0"})
    return {"neffs": 6, "tp_degree": 2, "cc_sleep_s_per_neff": cc_sleep, "cold": cold, "fine_tune": fine,
            "fine_tune_graph_key_off": off, "ratio_build": round(fine["build_s"] / cold["build_s"], 3),
            "ratio_build_graph_key_off": round(off["build_s"] / cold["build_s"], 3)}


def _ratios(cold: dict, fine: dict) -> dict:
    return {"ratio_build": round(fine["build_s"] / cold["build_s"], 3),
            "ratio_build_validate": round((fine["build_s"] + fine["validate_s"]) /
                                          (cold["build_s"] + cold["validate_s"]), 3)}


def textgen_row(tmp: Path) -> dict:
    """The text-generation row: cold build + validate of 6 graphs, then a fine-tune (seed 0 -> 7, the same
    config) build + validate: compiles, relinks, wall seconds, ratios, store bytes."""
    from tests.helpers.textgen import save_llama, write_project

    root = tmp / "textgen"
    cfg = write_project(root, backend="inductor", llama_buckets="{ batch = [1, 2], seq = [8, 16] }", gpt2=False,
                        profile='weights = "external"')
    save_llama(root / "hf-llama", 0)
    cold = _phase(cfg)
    save_llama(root / "hf-llama", 7)
    fine = _phase(cfg)
    return {"graphs": 6, "model": "tiny Llama (2 layers, hidden 64, vocab 1000), batch [1, 2], seq [8, 16]",
            "cold": cold, "fine_tune": fine, **_ratios(cold, fine), "store_latest": _store_bytes(cfg)}


def bucket_row(tmp: Path, backend: str, buckets: int, hidden: int, cc_sleep: float) -> dict:
    """The inductor or Neuron row: cold then fine-tune of the ``Net`` model with ``buckets`` batch buckets."""
    root = tmp / "proj"
    env = _neuron_env(tmp, cc_sleep) if backend == "neuron" else {}
    cfg = _write(root, 0, hidden, buckets, backend)
    cold = _phase(cfg, env)
    _write(root, 7, hidden, buckets, backend)
    fine = _phase(cfg, env)
    return {"backend": backend, "neuron_double": bool(env), "cc_sleep_s": cc_sleep, "buckets": buckets,
            "hidden": hidden, "cold": cold, "fine_tune": fine, **_ratios(cold, fine), "store_latest": _store_bytes(cfg)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("inductor", "neuron", "nxdi", "textgen"), default="inductor")
    ap.add_argument("--buckets", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--cc-sleep", type=float, default=None,
                    help="seconds each neuronx-cc run of the double takes (default: 0 for neuron, 2 per NEFF for nxdi)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.cc_sleep is None:
        a.cc_sleep = 2.0 if a.backend == "nxdi" else 0.0
    with tempfile.TemporaryDirectory(prefix="relink-bench-") as tmp:
        if a.backend == "nxdi":
            out = {"nxdi": nxdi(Path(tmp), a.cc_sleep)}
        elif a.backend == "textgen":
            out = {"textgen": textgen_row(Path(tmp))}
        else:
            out = bucket_row(Path(tmp), a.backend, a.buckets, a.hidden, a.cc_sleep)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
