"""SIGKILL the build of the shipped matrix at random moments, and check the store after each kill.

    python benchmarks/sigkill_shipped.py [--kills 20] [--seed 6] [--jobs 2] [--min-delay 1] [--max-delay 45]

Copies the repository's ``buckets.toml`` and ``models/`` into a fresh folder (with its own store), then
``--kills`` times: starts ``neuron-build build -n JOBS``, waits a seeded random delay, SIGKILLs the
builder (its compile workers die with it), and runs ``neuron-build verify --deep --json``, which must
report no bad object; the objects stored by earlier rounds must still be byte-identical. Each restarted
build resumes where the killed one stopped. Finally one build runs to the end: it must exit 0 with every
target PASS, and ``verify --deep`` must be clean. Prints one line per kill and a JSON summary; exits 1 on
any violation. Not a test (it needs the full shipped build, about 3 minutes on inductor, plus restarts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "neuron_build.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)


def digests(store: Path) -> dict[str, str]:
    """{layout path: sha256} of every committed manifest (``ac/``) and blob (``cas/``) of the store."""
    out = {}
    for f in sorted([*store.glob("ac/*/*.json"), *store.glob("cas/*/*")]):
        if f.is_file() and not f.name.startswith("."):
            out[f.relative_to(store).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def log_events(state: Path, since: int) -> list[dict]:
    log = state / "build.log"
    if not log.exists():
        return []
    return [json.loads(ln) for ln in log.read_text().splitlines()[since:]]


def log_len(state: Path) -> int:
    log = state / "build.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def workers(marker: str) -> int:
    r = subprocess.run(["pgrep", "-af", "neuron_build.worker"], capture_output=True, text=True)
    return sum(marker in ln for ln in r.stdout.splitlines())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min-delay", type=float, default=1.0)
    ap.add_argument("--max-delay", type=float, default=45.0)
    ap.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    args = ap.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sigkill-shipped-"))
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "buckets.toml", work / "buckets.toml")
    shutil.copytree(REPO / "models", work / "models", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    store, state = work / "artifacts", work / ".neuron-build"
    rng = random.Random(args.seed)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    violations: list[str] = []
    rounds = []
    kept: dict[str, str] = {}
    t_all = time.monotonic()
    print(f"workdir {work}; {args.kills} kills, seed {args.seed}, -n {args.jobs}", flush=True)
    for i in range(args.kills):
        start_line = log_len(state)
        out = open(work / f"round{i:02d}.out", "wb")
        p = subprocess.Popen([sys.executable, "-m", "neuron_build.cli", "build", "-n", str(args.jobs)], cwd=work,
                             env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        delay = rng.uniform(args.min_delay, args.max_delay)
        t0 = time.monotonic()
        while time.monotonic() - t0 < delay and p.poll() is None:
            time.sleep(0.05)
        finished = p.poll() is not None
        if not finished:
            os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 30
        while workers(str(store)) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = workers(str(store))
        evs = log_events(state, start_line)
        started = [e["target"] for e in evs if e.get("event") == "compiling"]
        done = [e["target"] for e in evs if e.get("event") in ("built", "compile failed")]
        in_flight = [t for t in started if t not in done]
        v = cli("verify", "--deep", "--json", cwd=work)
        rep = json.loads(v.stdout) if v.stdout.strip() else {}
        now = digests(store)
        lost = [f for f in kept if now.get(f) != kept[f]]
        row = {"round": i, "delay_s": round(delay, 2), "finished_before_kill": finished,
               "built_this_round": done, "killed_mid_compile": in_flight, "objects": rep.get("ok"),
               "verify_rc": v.returncode, "bad": rep.get("bad"), "lost_files": lost, "orphan_workers": orphans}
        rounds.append(row)
        if v.returncode != 0 or rep.get("bad"):
            violations.append(f"round {i}: verify --deep not clean: {rep}")
        if lost:
            violations.append(f"round {i}: stored files changed or lost: {lost}")
        if orphans:
            violations.append(f"round {i}: {orphans} compile workers outlived the killed builder")
        kept = now
        print(f"kill {i + 1:2}/{args.kills} after {delay:5.1f} s: "
              f"{'build had finished' if finished else 'killed'}; built this round {len(done)}, "
              f"compiles killed {len(in_flight)} {in_flight}; verify --deep: {rep.get('ok')} ok, "
              f"{len(rep.get('bad') or [])} bad", flush=True)
    t_final = time.monotonic()
    final = cli("build", "-n", str(args.jobs), cwd=work)
    plan = json.loads(cli("plan", "--json", cwd=work).stdout)
    v = cli("verify", "--deep", "--json", cwd=work)
    rep = json.loads(v.stdout)
    not_pass = [r["target"] for r in plan if r["state"] != "cached"]
    if final.returncode != 0 or not_pass:
        violations.append(f"final build exit {final.returncode}, not built: {not_pass}\n{final.stdout[-2000:]}")
    if v.returncode != 0:
        violations.append(f"final verify --deep: {rep}")
    compiles = sum(1 for e in log_events(state, 0) if e.get("event") == "compiling")
    summary = {"kills": args.kills, "seed": args.seed, "jobs": args.jobs, "targets": len(plan),
               "all_pass": not not_pass and final.returncode == 0, "final_verify_ok": rep.get("ok"),
               "final_build_s": round(time.monotonic() - t_final, 1), "total_s": round(time.monotonic() - t_all, 1),
               "compiles_started": compiles,
               "kills_mid_compile": sum(bool(r["killed_mid_compile"]) for r in rounds),
               "compiles_killed": sum(len(r["killed_mid_compile"]) for r in rounds),
               "rounds_finished_before_kill": sum(r["finished_before_kill"] for r in rounds),
               "violations": violations}
    print(final.stdout.strip().splitlines()[-1] if final.stdout.strip() else "")
    print(json.dumps(summary, indent=2))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
