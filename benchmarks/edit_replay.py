"""Edit replay: what the graph key saves over a scripted sequence of edits to the shipped models.

The shipped project (``buckets.toml``, ``models/``) is copied to a temporary folder, built once, then the
edits of :data:`EDITS` are applied one after the other (each on top of the last), with a ``neuron-build
build`` after each, twice: with the graph key (the default) and without it (``NEURON_BUILD_GRAPH_KEY=0``),
each replay in its own fresh copy. Each edit is listed with its kind: ``neutral`` (comments, docstrings,
renamed locals, an extracted helper, reordered imports: the source key changes, the graph does not) or
``graph`` (an activation, an eps, a weight, another op: the graph changes), and the targets whose graph it
changes (``ideal``: what a perfect build compiles).

Counted from the build ledger (``compile`` and ``graph-reused`` records of each build), per edit: compiles,
graph reuses, wall seconds of the build; per replay: the totals, the ideal (compiles == the targets of
graph-changing edits), and at the end of each replay the wall seconds of a no-op build and of ``plan``.
``neutral_cost_ratio`` is the mean wall time of the graph-neutral edits' builds with the graph key over
that of the same builds without it (the compiles it avoids); the goal is at most 0.15. ``validate`` runs
once after the graph-key replay (every reused artifact checked against the eager reference).

    .venv/bin/python benchmarks/edit_replay.py [--backend torchscript|inductor|neuron] [--models ffn rmsnorm_naive ...]
        [--edits N] [--json-out benchmarks/results/edit_replay.json]

``--backend neuron`` replays the same edits on the XLA path and also counts **neuronx-cc runs** per edit
(``neuronx_cc_runs``): on a host without the Neuron toolchain the test double in ``tests/fakes`` stands in
(put on ``PYTHONPATH``/``PATH`` by path, never imported here), whose neuronx-cc writes one line per run into
its ``calls`` file; with the real toolchain the runs are the ledger's compiles.

The minilm model is an installed Hugging Face package (no source to edit) and is left out.

``--buckets N`` (issue 31, item 4) measures instead what proving a graph unchanged costs per target: a tiny
model with N batch buckets (:data:`WIDE_MODEL`) is built once (N compiles), then two graph-neutral edits (a
comment in the factory) are built, the first with the graph probe off (``NEURON_BUILD_GRAPH_PROBE=0``: one
worker per target, the behaviour before the probe), the second with it on (one probe worker for the model,
:mod:`neuron_build.build.graph.probe`). Reported: each build's wall seconds, seconds per target, compiles,
reuses, probe runs, and ``edit_vs_compiles``: the edit's wall time over the initial build's (the compiles it
avoids; goal at most 0.15, and at most 0.5 s per target); with ``--backend neuron``, neuronx-cc runs.

    .venv/bin/python benchmarks/edit_replay.py --buckets 20 --backend inductor
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FFN = "models/ffn.py"
RMS = "models/rmsnorm.py"
FFN_T = ("ffn",)
NAIVE, FUSED = ("rmsnorm_naive",), ("rmsnorm_fused",)


def sub(old: str, new: str, count: int = 1):
    """An edit replacing ``old`` with ``new`` (it must be there)."""
    def apply(text: str) -> str:
        if old not in text:
            raise SystemExit(f"edit script out of date: {old!r} not found")
        return text.replace(old, new, count)
    return apply


def prepend(line: str):
    return lambda text: line + text


def append(line: str):
    return lambda text: text + line


#: (name, file, kind, models whose graph changes, edit). Applied in order, each on top of the last.
EDITS = [
    ("ffn: a comment at the top", FFN, "neutral", (), prepend("# feed-forward block used by the examples\n")),
    ("ffn: the class docstring", FFN, "neutral", (), sub("Post-norm FFN block:", "The post-norm FFN block,")),
    ("ffn: locals in forward", FFN, "neutral", (), sub(
        "        return self.norm(x + self.down(self.act(self.up(x))))",
        "        hidden = self.act(self.up(x))\n        return self.norm(x + self.down(hidden))")),
    ("ffn: a helper extracted from forward", FFN, "neutral", (), sub(
        "        hidden = self.act(self.up(x))\n        return self.norm(x + self.down(hidden))",
        "        return self.norm(_residual(x, self.down(self.act(self.up(x)))))\n\n\n"
        "def _residual(x, y):\n    \"\"\"The residual sum.\"\"\"\n    return x + y")),
    ("ffn: imports reordered", FFN, "neutral", (), sub("import torch\nfrom torch import nn\n",
                                                       "from torch import nn\nimport torch\n")),
    ("ffn: GELU -> tanh-approximate GELU", FFN, "graph", FFN_T, sub("nn.GELU()", "nn.GELU(approximate=\"tanh\")")),
    ("ffn: LayerNorm eps 1e-5 -> 1e-6", FFN, "graph", FFN_T, sub("eps: float = 1e-5", "eps: float = 1e-6")),
    ("ffn: a comment in __init__", FFN, "neutral", (), sub("        self.up = nn.Linear(hidden, inner)",
                                                          "        # up-projection\n"
                                                          "        self.up = nn.Linear(hidden, inner)")),
    ("ffn: activation -> ReLU", FFN, "graph", FFN_T, sub("nn.GELU(approximate=\"tanh\")", "nn.ReLU()")),
    ("ffn: a local in build", FFN, "neutral", (), sub("    return FFN(hidden, inner)",
                                                      "    block = FFN(hidden, inner)\n    return block")),
    ("ffn: weights (seed 0 -> 1)", FFN, "graph", FFN_T, sub("seed: int = 0) -> FFN", "seed: int = 1) -> FFN")),
    ("rmsnorm: a comment at the top", RMS, "neutral", (), prepend("# two RMSNorms that must agree\n")),
    ("rmsnorm: naive's docstring", RMS, "neutral", (), sub("computed in fp32 and cast back to x's dtype.",
                                                           "in fp32, then cast back to the input dtype.")),
    ("rmsnorm: naive pow(2) -> x * x", RMS, "graph", NAIVE, sub("xf.pow(2).mean(-1, keepdim=True)",
                                                                "(xf * xf).mean(-1, keepdim=True)")),
    ("rmsnorm: a local renamed in fused", RMS, "neutral", (), sub(
        "        y = torch.nn.functional.rms_norm(x.float(), (self.dim,), self.weight.float(), eps=self.eps)\n"
        "        return y.to(x.dtype)",
        "        normed = torch.nn.functional.rms_norm(x.float(), (self.dim,), self.weight.float(), eps=self.eps)\n"
        "        return normed.to(x.dtype)")),
    ("rmsnorm: fused eps doubled", RMS, "graph", FUSED, sub("self.weight.float(), eps=self.eps)",
                                                           "self.weight.float(), eps=2 * self.eps)")),
    ("rmsnorm: imports reordered", RMS, "neutral", (), sub("import torch\nfrom torch import nn\n",
                                                           "from torch import nn\nimport torch\n")),
    ("rmsnorm: a helper extracted in naive", RMS, "neutral", (), lambda t: sub(
        "        xf = x.float()\n", "        xf = _fp32(x)\n")(t) + "\n\ndef _fp32(t):\n    return t.float()\n"),
    ("rmsnorm: weights of both (0.1 -> 0.2 noise)", RMS, "graph", NAIVE + FUSED, sub(
        "1.0 + 0.1 * torch.randn", "1.0 + 0.2 * torch.randn")),
    ("ffn: a trailing comment", FFN, "neutral", (), append("# end of the FFN example\n")),
    ("rmsnorm: the module docstring", RMS, "neutral", (), sub("two ways that must agree.",
                                                              "written two ways that must agree.")),
    ("ffn: the build docstring", FFN, "neutral", (), sub("An FFN block with deterministic random weights",
                                                         "An FFN block with seeded random weights")),
]


def project_copy(dest: Path, backend: str, models: list[str]) -> Path:
    """The shipped project copied to ``dest``, with ``backend`` and only ``models``. Returns its config."""
    import tomlkit

    shutil.copytree(REPO / "models", dest / "models", ignore=shutil.ignore_patterns("__pycache__"))
    doc = tomlkit.parse((REPO / "buckets.toml").read_text())
    doc["build"]["backend"] = backend
    for name in list(doc["models"]):
        if name not in models:
            del doc["models"][name]
        elif "reference" in doc["models"][name] and doc["models"][name]["reference"] not in models:
            del doc["models"][name]["reference"]
    cfg = dest / "buckets.toml"
    cfg.write_text(tomlkit.dumps(doc))
    return cfg


def cli(cfg: Path, *args: str, env: dict | None = None, timeout: float = 7200) -> tuple[float, subprocess.CompletedProcess]:
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "neuron_build.cli", *args, "-c", str(cfg)], env=e, text=True,
                       capture_output=True, timeout=timeout)
    return time.monotonic() - t0, p


def ledger_counts(cfg: Path, seen: int) -> tuple[int, dict[str, int]]:
    from neuron_build.store import LocalStore, ledger

    recs = ledger.read(LocalStore(cfg.parent / "artifacts"))
    new = recs[seen:] if len(recs) >= seen else recs
    return len(recs), {"compiles": sum(r.event == "compile" for r in new),
                       "reuses": sum(r.event == "graph-reused" for r in new),
                       "failed": sum(r.event == "compile" and r.status != "PASS" for r in new)}


def targets_of(cfg: Path) -> dict[str, int]:
    import tomllib

    doc = tomllib.loads(cfg.read_text())
    out = {}
    for name, m in doc["models"].items():
        n = len(m.get("dtypes", ["fp32"])) * len(m.get("profiles", []))
        for values in (m.get("buckets") or {}).values():
            n *= len(values)
        out[name] = n
    return out


def neuron_double_env(calls: Path) -> dict:
    """The environment that puts the Neuron test double (tests/fakes) in front, by path (README there)."""
    fakes = REPO / "tests" / "fakes"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    return {"PYTHONPATH": os.pathsep.join([str(fakes / "neuron_sdk"), str(REPO), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([str(fakes / "bin"), env.get("PATH", "")]), "FAKE_NEURON_PYTHON": sys.executable,
            "FAKE_NEURONX_CC_CALLS": str(calls)}


def cc_runs(env: dict) -> int | None:
    calls = env.get("FAKE_NEURONX_CC_CALLS")
    if not calls:
        return None
    return len(Path(calls).read_text().splitlines()) if Path(calls).exists() else 0


def replay(workdir: Path, backend: str, models: list[str], edits: list, graph_key: bool) -> dict:
    cfg = project_copy(workdir, backend, models)
    env = {} if graph_key else {"NEURON_BUILD_GRAPH_KEY": "0"}
    if backend == "neuron" and not _real_neuron():
        env.update(neuron_double_env(workdir / "neuronx-cc-calls.jsonl"))
    n_targets = targets_of(cfg)
    wall, p = cli(cfg, "build", env=env)
    if p.returncode != 0:
        raise SystemExit(f"initial build failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    seen, first = ledger_counts(cfg, 0)
    runs = cc_runs(env)
    rows = []
    for name, rel, kind, changed, fn in edits:
        f = cfg.parent / rel
        f.write_text(fn(f.read_text()))
        wall, p = cli(cfg, "build", env=env)
        if p.returncode != 0:
            raise SystemExit(f"build after {name!r} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        runs_before = cc_runs(env)
        seen, c = ledger_counts(cfg, seen)
        if runs_before is not None:
            c["neuronx_cc_runs"] = runs_before - runs
            runs = runs_before
        ideal = sum(n_targets[m] for m in changed if m in n_targets)
        rows.append({"edit": name, "kind": kind, "ideal": ideal, **c, "wall_s": round(wall, 2)})
        print(f"  {'graph key' if graph_key else 'no graph key'}: {name}: {c} in {wall:.1f} s (ideal {ideal})",
              file=sys.stderr, flush=True)
    noop_s, p = cli(cfg, "build", env=env)
    plan_s, _ = cli(cfg, "plan", env=env)
    out = {"initial_build": {**first, "wall_s": round(wall, 2)}, "edits": rows,
           "compiles": sum(r["compiles"] for r in rows), "reuses": sum(r["reuses"] for r in rows),
           "failed": sum(r["failed"] for r in rows), "ideal": sum(r["ideal"] for r in rows),
           "neuronx_cc_runs": {kind: sum(r.get("neuronx_cc_runs", 0) for r in rows if r["kind"] == kind)
                               for kind in ("neutral", "graph")} if runs is not None else None,
           "noop_s": round(noop_s, 2), "plan_s": round(plan_s, 2)}
    if graph_key:
        v_s, v = cli(cfg, "validate", env=env)
        out["validate"] = {"ok": v.returncode == 0, "wall_s": round(v_s, 1),
                           "tail": v.stdout.strip().splitlines()[-1:] if v.stdout.strip() else []}
    return out


WIDE_MODEL = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(d, 32)
        self.down = nn.Linear(32, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def build():
    return Block()
"""

WIDE_CONFIG = """
[build]
backend = "{backend}"
timeout_s = 3600
heartbeat_s = 30

[profiles.p1]
compiler_args = []

[models.wide]
factory = "widelib.wide:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [{batches}] }}
"""


def probe_runs(cfg: Path) -> int:
    from neuron_build.build.graph import probe as graph_probe
    from neuron_build.project.config import load_project

    log = load_project(cfg).state_dir / graph_probe.PROBE_DIR / graph_probe.PROBE_LOG
    return len(log.read_text().splitlines()) if log.exists() else 0


def wide(workdir: Path, backend: str, n: int) -> dict:
    """The ``--buckets`` benchmark (see the module docstring): one model of ``n`` buckets."""
    (workdir / "widelib").mkdir(parents=True)
    (workdir / "widelib" / "__init__.py").write_text("")
    src = workdir / "widelib" / "wide.py"
    src.write_text(WIDE_MODEL)
    cfg = workdir / "buckets.toml"
    cfg.write_text(WIDE_CONFIG.format(backend=backend, batches=", ".join(str(b) for b in range(1, n + 1))))
    env: dict = {}
    if backend == "neuron" and not _real_neuron():
        env.update(neuron_double_env(workdir / "neuronx-cc-calls.jsonl"))
    rows, seen, runs = {}, 0, 0
    for name, text, probe in (("initial build", WIDE_MODEL, True),
                              ("graph-neutral edit, probe off (before)", "# an edit\n" + WIDE_MODEL, False),
                              ("graph-neutral edit, probe on (after)", "# another edit\n" + WIDE_MODEL, True)):
        src.write_text(text)
        probes0 = probe_runs(cfg)
        wall, p = cli(cfg, "build", env={**env, **({} if probe else {"NEURON_BUILD_GRAPH_PROBE": "0"})})
        if p.returncode != 0:
            raise SystemExit(f"{name} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        seen, c = ledger_counts(cfg, seen)
        now = cc_runs(env)
        if now is not None:
            c["neuronx_cc_runs"], runs = now - runs, now
        rows[name] = {**c, "probe_runs": probe_runs(cfg) - probes0, "wall_s": round(wall, 2),
                      "s_per_target": round(wall / n, 3)}
        print(f"  {name}: {rows[name]}", file=sys.stderr, flush=True)
    initial = rows["initial build"]["wall_s"]
    before, after = (rows["graph-neutral edit, probe off (before)"], rows["graph-neutral edit, probe on (after)"])
    return {"backend": backend, "buckets": n, "builds": rows, "host_cpus": os.cpu_count(),
            "load_average_1m": round(os.getloadavg()[0], 1),
            "edit_vs_compiles": {"before": round(before["wall_s"] / initial, 3),
                                 "after": round(after["wall_s"] / initial, 3)},
            "goal_met": after["s_per_target"] <= 0.5 and after["wall_s"] / initial <= 0.15}


def _real_neuron() -> bool:
    from neuron_build.project.toolchain import neuron_status
    return neuron_status().usable


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="torchscript", choices=["torchscript", "inductor", "compile-cache", "neuron"])
    ap.add_argument("--models", nargs="+", default=["ffn", "rmsnorm_naive", "rmsnorm_fused"])
    ap.add_argument("--edits", type=int, default=len(EDITS), help="replay only the first N edits")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--buckets", type=int, default=None,
                    help="measure a graph-neutral edit of one tiny model with this many buckets instead")
    args = ap.parse_args()
    if args.buckets:
        with tempfile.TemporaryDirectory(prefix="edit-replay-wide-") as tmp:
            doc = wide(Path(tmp), args.backend, args.buckets)
        text = json.dumps(doc, indent=2)
        print(text)
        if args.json_out:
            args.json_out.write_text(text + "\n")
        return 0
    files = {FFN} if args.models == ["ffn"] else {FFN, RMS} if "ffn" in args.models else {RMS}
    edits = [e for e in EDITS if e[1] in files][: args.edits]
    with tempfile.TemporaryDirectory(prefix="edit-replay-") as tmp:
        on = replay(Path(tmp) / "with", args.backend, args.models, edits, graph_key=True)
        off = replay(Path(tmp) / "without", args.backend, args.models, edits, graph_key=False)
    neutral_on = [r["wall_s"] for r in on["edits"] if r["kind"] == "neutral"]
    neutral_off = [r["wall_s"] for r in off["edits"] if r["kind"] == "neutral"]
    doc = {
        "backend": args.backend, "models": args.models, "edits": len(edits),
        "graph_changing_edits": sum(e[2] == "graph" for e in edits),
        "neutral_edits": sum(e[2] == "neutral" for e in edits),
        "with_graph_key": on, "without_graph_key": off,
        "compiles_equal_ideal": on["compiles"] == on["ideal"],
        "neutral_cost_ratio": round(statistics.mean(neutral_on) / statistics.mean(neutral_off), 3)
        if neutral_on and neutral_off else None,
        "neutral_wall_s_median": {"with": statistics.median(neutral_on) if neutral_on else None,
                                  "without": statistics.median(neutral_off) if neutral_off else None},
        "noop_s": {"with": on["noop_s"], "without": off["noop_s"]},
        "plan_s": {"with": on["plan_s"], "without": off["plan_s"]},
        "host_cpus": os.cpu_count(),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0 if doc["compiles_equal_ideal"] and not on["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
