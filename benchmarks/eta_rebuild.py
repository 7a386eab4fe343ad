"""How right the progress line's ETA is: build the shipped matrix once, force a rebuild (the store's artifacts
and doit's database removed, its ledger kept: the same keys, so each prediction is the key's own recorded
time), and compare the ETA of each line of the second build (``[k/N] <target> PASS in 3.1 s; 5 left, about
20 s``) with the time the build really took from that line on.

    .venv/bin/python benchmarks/eta_rebuild.py [--backend torchscript] [--jobs 2] [--all-buckets]

Prints one JSON object: both builds' wall seconds, each line's ETA and real remaining seconds, and the first
line's relative error (goal, issue 32: within 25 %).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.projects import shipped_on  # noqa: E402

LINE = re.compile(r"^\[(\d+)/(\d+)\] (\S+) .*; (\d+) left, about (\S+)")


def seconds(text: str) -> float:
    """``42 s``-style parts of :func:`neuron_build.build.progress.format_duration` back to seconds."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", text.replace(" ", ""))
    h, mi, s = (int(g) if g else 0 for g in m.groups()) if m else (0, 0, 0)
    return h * 3600 + mi * 60 + s


def build(cfg: Path, jobs: int) -> tuple[float, list[tuple[float, str]]]:
    exe = str(Path(sys.executable).with_name("neuron-build"))
    t0 = time.monotonic()
    p = subprocess.Popen([exe, "-c", str(cfg), "build", "-n", str(jobs)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - t0, ln.rstrip("\n")) for ln in p.stdout]
    if p.wait() != 0:
        raise SystemExit("build failed:\n" + "\n".join(ln for _, ln in lines))
    return time.monotonic() - t0, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="torchscript")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--all-buckets", action="store_true", help="every seq bucket of the encoder (default: seq 32)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eta-rebuild-"))
    try:
        cfg = shipped_on(tmp / "proj", a.backend, one_seq=not a.all_buckets)
        first, _ = build(cfg, a.jobs)
        store = cfg.parent / "artifacts"
        for child in store.iterdir():
            if child.name != "ledger":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        for db in cfg.parent.glob(".doit.db*"):
            db.unlink()
        second, lines = build(cfg, a.jobs)
        rows = []
        for at, ln in lines:
            m = LINE.match(ln)
            if m:
                rows.append({"line": ln, "at_s": round(at, 2), "eta_s": seconds(m.group(5)),
                             "real_remaining_s": round(second - at, 2)})
        first_err = (abs(rows[0]["eta_s"] - rows[0]["real_remaining_s"]) / rows[0]["real_remaining_s"]
                     if rows and rows[0]["real_remaining_s"] > 0 else None)
        print(json.dumps({"backend": a.backend, "jobs": a.jobs, "first_build_s": round(first, 2),
                          "second_build_s": round(second, 2), "lines": rows,
                          "first_line_relative_error": None if first_err is None else round(first_err, 3)}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
