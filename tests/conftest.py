"""Shared fixtures: small projects written into tmp folders, and the CLI run in-process or as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

TINY_MODEL = '''
"""A tiny model for fast compiles in tests."""
import torch
from torch import nn
from tinylib.act import scale


class Tiny(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return scale(torch.relu(self.lin(x)))


def build(width: int = 16):
    return Tiny(width)


def broken():
    raise RuntimeError("factory exploded on purpose")


def slow():
    import time
    time.sleep(60)
    return Tiny()


def hog():
    import os, signal
    block = bytearray(64 * 2**20)  # touch 64 MiB so a peak is visible
    for i in range(0, len(block), 4096):
        block[i] = 1
    os.kill(os.getpid(), signal.SIGKILL)
'''

TINY_CONFIG = '''
[build]
backend = "torchscript"
timeout_s = {timeout}
heartbeat_s = 1

[profiles.p1]
compiler_args = ["--optlevel=1"]

[profiles.p2]
compiler_args = ["-O2", "--model-type", "transformer"]

[models.tiny]
factory = "tinylib.tiny:build"
kwargs = {{ width = 16 }}
dtypes = ["fp32", "bf16"]
profiles = ["p1", "p2"]
inputs = [{{ name = "x", shape = ["batch", 16] }}]
buckets = {{ batch = [1, 4] }}

[models.other]
factory = "tinylib.other:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{{ name = "x", shape = [2, 16] }}]
'''


def write_tiny_project(root: Path, timeout: float = 120, extra: str = "") -> Path:
    """A project with two models (``tiny``: 2 buckets x 2 dtypes x 2 profiles; ``other``: 1 target) built
    with the torchscript backend. Returns the config path."""
    (root / "tinylib").mkdir(parents=True, exist_ok=True)
    (root / "tinylib" / "__init__.py").write_text("")
    (root / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 2\n")
    (root / "tinylib" / "tiny.py").write_text(TINY_MODEL)
    (root / "tinylib" / "other.py").write_text(
        "import torch\n\ndef build():\n    torch.manual_seed(1)\n    return torch.nn.Linear(16, 3)\n")
    cfg = root / "buckets.toml"
    cfg.write_text(TINY_CONFIG.format(timeout=timeout) + textwrap.dedent(extra))
    return cfg


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """Config path of a fresh tiny project."""
    return write_tiny_project(tmp_path / "proj")


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 600):
    """Run ``neuron-build`` as a user would, in a subprocess. Returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "neuron_build.cli", *args], cwd=cwd, env=e, text=True,
                          capture_output=True, timeout=timeout)


def compiles_in_log(state_dir: Path) -> list[str]:
    """Target ids of every compile started, read from the project's build log."""
    log = state_dir / "build.log"
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "compiling":
            out.append(ev["target"])
    return out


def manifest_file(store, key: str) -> Path:
    """The file of ``key``'s manifest in a local store (``ac/<key[:2]>/<key>.json``)."""
    from neuron_build.store import layout

    return store.path(layout.manifest_path(key))


def rewrite_manifest(path: Path, change) -> dict:
    """Edit a stored manifest the way a deliberate test fixture must: apply ``change(dict)`` and re-seal it
    with its own sha256, so the store still sees a complete object (an edit without resealing is caught
    as corruption and quarantined)."""
    from neuron_build.store.local import SELF_DIGEST, manifest_digest

    m = json.loads(path.read_text())
    change(m)
    m.pop(SELF_DIGEST, None)
    m[SELF_DIGEST] = manifest_digest(m)
    path.write_text(json.dumps(m, indent=2) + "\n")
    return m


# -- a real S3 endpoint (tests/s3server.py) -----------------------------------------------------------

@pytest.fixture(scope="session")
def s3_server():
    """One moto server for the whole session, on 127.0.0.1 and a free port."""
    from s3server import S3Server
    srv = S3Server().start()
    yield srv
    srv.stop()


def aws_env(monkeypatch, endpoint: str, tmp_path: Path) -> None:
    """Point s3fs and boto3 at ``endpoint`` with test credentials, as a user's environment would, and
    keep every other AWS setting of the host out (no profile, no config file, no instance metadata)."""
    from s3server import ACCESS_KEY, REGION, SECRET_KEY
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/neuron-build-tests/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/neuron-build-tests/aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    import s3fs
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """The session's S3 server, reset (``POST /moto-api/reset``), with the AWS variables pointing at it."""
    s3_server.reset()
    aws_env(monkeypatch, s3_server.url, tmp_path)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh, empty bucket on the session's S3 server; its name."""
    import secrets

    name = f"nb-test-{secrets.token_hex(4)}"
    s3_env.client().create_bucket(Bucket=name)
    return name


def in_a_terminal(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300,
                  columns: int = 160) -> str:
    """Run ``args`` with stdin, stdout and stderr on a pseudo-terminal (``columns`` wide), in ``env`` (default
    ``os.environ``; this checkout first on PYTHONPATH; NO_COLOR, FORCE_COLOR, COLUMNS and LINES removed); return what it
    wrote, escape codes included."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    e = {k: v for k, v in (os.environ if env is None else env).items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    e.update({"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), e.get("PYTHONPATH")) if p),
              "TERM": "xterm-256color"})
    p = subprocess.Popen(args, cwd=cwd, env=e, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    buf, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    return buf.decode(errors="replace")


@pytest.fixture(autouse=True)
def _no_config_left_set():
    """No test (nor the code it runs in-process) leaves ``NEURON_BUILD_CONFIG`` changed: every later
    subprocess of the same pytest worker would build that project instead of its own."""
    before = os.environ.get("NEURON_BUILD_CONFIG")
    yield
    assert os.environ.get("NEURON_BUILD_CONFIG") == before, "NEURON_BUILD_CONFIG was left changed"
