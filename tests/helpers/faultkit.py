"""Helpers of the fault-injection suite: a quick project (a trivial torchscript model, one target per
bucket), builders as real processes, the build log read back, and a real small file system (tmpfs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, compiles_in_log, run_cli

HERE = Path(__file__).resolve().parent


QUICK_MODEL = '''
"""A trivial model: compiles in the time it takes the worker to import torch."""
import os
import time

import torch
from torch import nn


class Quick(nn.Module):
    def __init__(self, width: int = 8, extra_mb: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(width, width)
        # an extra layer makes the saved artifact about extra_mb MiB larger
        self.big = nn.Linear(width, extra_mb * 2**18 // width) if extra_mb else None

    def forward(self, x):
        y = torch.relu(self.lin(x))
        if self.big is not None:
            y = y + self.big(y).sum(-1, keepdim=True)
        return y


def build(width: int = 8, extra_mb: int = 0):
    return Quick(width, extra_mb)


def slow(seconds: float = 5.0, width: int = 8):
    time.sleep(seconds)
    return Quick(width)


def gate(path: str, width: int = 8):
    """Blocks while the file ``path`` exists (a test holds a compile open as long as it needs)."""
    while os.path.exists(path):
        time.sleep(0.05)
    return Quick(width)


def broken():
    raise RuntimeError("factory exploded on purpose")


def flaky():
    os._exit(70)  # the transient exit status


def hog():
    import signal
    block = bytearray(64 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's out-of-memory killer does
'''

QUICK_CONFIG = '''
[build]
backend = "torchscript"
store = "{store}"
timeout_s = {timeout}
heartbeat_s = 1
transient_retries = {retries}
{build_extra}

[profiles.p]
compiler_args = ["--optlevel=1"]

[models.quick]
factory = "{factory}"
kwargs = {kwargs}
dtypes = ["fp32"]
profiles = ["p"]
inputs = [{{ name = "x", shape = ["n", 8] }}]
buckets = {{ n = [{buckets}] }}
{models_extra}
'''


def write_quick_project(root: Path, n: int = 4, store: str = "artifacts", timeout: float = 120, retries: int = 0,
                        build_extra: str = "", models_extra: str = "", factory: str = "quicklib.quick:build",
                        kwargs: str = "{ width = 8 }") -> Path:
    """A project whose model ``quick`` has ``n`` buckets (targets ``quick/n1/fp32/p`` ...
    ``quick/n<n>/fp32/p``), built with the torchscript backend. Returns the config path."""
    (root / "quicklib").mkdir(parents=True, exist_ok=True)
    (root / "quicklib" / "__init__.py").write_text("")
    (root / "quicklib" / "quick.py").write_text(QUICK_MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(QUICK_CONFIG.format(store=store, timeout=timeout, retries=retries, build_extra=build_extra,
                                       models_extra=models_extra, factory=factory, kwargs=kwargs,
                                       buckets=", ".join(str(i) for i in range(1, n + 1))))
    return cfg


def quick_ids(n: int) -> list[str]:
    return [f"quick/n{i}/fp32/p" for i in range(1, n + 1)]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def start(args: list[str], out: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start ``python ARGS...`` in its own session, stdout and stderr into ``out``."""
    f = open(out, "wb")
    try:
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=cli_env(), stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        f.close()


def start_build(cfg: Path, out: Path, *args: str) -> subprocess.Popen:
    """``neuron-build build -c CFG ARGS...`` as a separate process."""
    return start(["-m", "neuron_build.cli", "build", "-c", str(cfg), *args], out)


def compile_counts(state_dir: Path) -> Counter:
    """How many compiles were started per target id, from the build log."""
    return Counter(compiles_in_log(state_dir))


def wait_for(pred, timeout: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def verify(cfg: Path, deep: bool = True, repair: bool = False) -> tuple[int, dict]:
    """``neuron-build verify [--deep] [--repair] --json``: (exit status, report)."""
    r = run_cli("verify", *(["--deep"] if deep else []), *(["--repair"] if repair else []), "--json", "-c", str(cfg))
    if r.returncode == 2 and "does not exist (nothing was built into it)" in r.stderr:
        return 0, {"ok": 0, "bad": []}  # killed before the store folder was made: nothing to be inconsistent
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def plan_states(cfg: Path) -> dict[str, str]:
    r = run_cli("plan", "--json", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    return {row["target"]: row["state"] for row in json.loads(r.stdout)["targets"]}


def workers_alive(marker: str) -> list[str]:
    """Command lines of running compile workers whose request path contains ``marker``."""
    r = subprocess.run(["pgrep", "-af", "neuron_build.worker"], capture_output=True, text=True)
    return [ln for ln in r.stdout.splitlines() if marker in ln]


def kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def object_digests(store: Path) -> dict[str, dict[str, str]]:
    """{key: {file: sha256}} of every committed artifact in a store (its manifest in ``ac/``), each file's
    digest computed from the bytes of the blob the manifest names (``missing`` when there is none)."""
    import hashlib
    out = {}
    base = store / "ac"
    for p in sorted(base.glob("*/*.json")) if base.is_dir() else []:
        try:
            files = json.loads(p.read_text()).get("files") or {}
        except ValueError:
            out[p.stem] = {"manifest": "unreadable"}
            continue
        row = {}
        for name, ent in sorted(files.items()):
            blob = store / "cas" / ent["sha256"][:2] / ent["sha256"]
            row[name] = hashlib.sha256(blob.read_bytes()).hexdigest() if blob.is_file() else "missing"
        out[p.stem] = row
    return out


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A real, small file system mounted at ``path`` (tmpfs of ``size``, e.g. ``"40m"``); unmounted after.
    Skips the test, saying why, when it cannot be mounted (needs root, or CAP_SYS_ADMIN); fails instead
    when ``NEURON_BUILD_TESTS_NO_SKIP`` is set, as ``.ci/run`` sets it."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        fail = pytest.fail if os.environ.get("NEURON_BUILD_TESTS_NO_SKIP") else pytest.skip  # CI: never skip
        fail(f"cannot mount a {size} tmpfs at {path} to fill it up: {r.stderr.strip() or r.returncode} "
                    f"(the disk-full test needs root or CAP_SYS_ADMIN)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(fs: Path, leave_bytes: int) -> Path:
    """Fill the file system holding ``fs`` with a ballast file until ``leave_bytes`` (rounded to pages) are
    free. Returns the ballast file (delete it to free the space)."""
    ballast = fs / "ballast.bin"
    st = os.statvfs(fs)
    free = st.f_bavail * st.f_frsize
    want = max(0, free - leave_bytes)
    with open(ballast, "ab") as f:
        chunk = b"\0" * 2**20
        while want > 0:
            n = min(len(chunk), want)
            try:
                f.write(chunk[:n])
                f.flush()
            except OSError:
                break
            want -= n
    return ballast


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
