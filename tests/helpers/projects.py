"""Small projects written into tmp folders, config edits, and the checkout copied as a user clones it."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from neuron_build.errors import ConfigError
from neuron_build.project.config import load_project
from tests.helpers.cli import REPO

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
    print(f"hog: touched {len(block)} bytes in pid {os.getpid()}", flush=True)  # proof the factory ran
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


def manifest_file(store, key: str) -> Path:
    """The file of ``key``'s manifest in a local store (``ac/<key[:2]>/<key>.json``)."""
    from neuron_build.store import layout

    return store.path(layout.manifest_path(key))


def rewrite_manifest(path: Path, change) -> dict:
    """Edit a stored manifest the way a deliberate test fixture must: apply ``change(dict)`` and re-seal it
    with its own sha256, so the store still sees a complete object (an edit without resealing is caught
    as corruption and quarantined)."""
    from neuron_build.store.digests import SELF_DIGEST, manifest_digest

    m = json.loads(path.read_text())
    change(m)
    m.pop(SELF_DIGEST, None)
    m[SELF_DIGEST] = manifest_digest(m)
    path.write_text(json.dumps(m, indent=2) + "\n")
    return m



def faults_of(cfg: Path) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        load_project(cfg)
    assert ei.value.file == str(cfg)
    assert str(cfg) in str(ei.value)
    return ei.value.faults


def edit(cfg: Path, old: str, new: str) -> Path:
    text = cfg.read_text()
    assert old in text, old
    cfg.write_text(text.replace(old, new, 1))
    return cfg



def checkout_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    return dest



def shipped_on(dest: Path, backend: str, one_seq: bool = True) -> Path:
    """A copy of the checkout (:func:`checkout_copy`) whose shipped matrix builds on ``backend``, fp32 only, and
    with ``one_seq`` the encoder's seq-32 bucket only (one compile per model). Returns the config path."""
    cfg = checkout_copy(dest) / "buckets.toml"
    edit(cfg, 'backend = "auto"', f'backend = "{backend}"')
    edit(cfg, 'dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]')
    if one_seq:
        edit(cfg, "buckets = { batch = [8], seq = [32, 64, 128] }", "buckets = { batch = [8], seq = [32] }")
    return cfg


def twin_project(tmp_path: Path) -> Path:
    """The tiny project plus model ``twin``: model ``other``'s module with a comment on top (another source key,
    the same graph). Returns the config path."""
    cfg = write_tiny_project(tmp_path / "proj", extra='''
        [models.twin]
        factory = "tinylib.twin:build"
        dtypes = ["fp32"]
        profiles = ["p1"]
        inputs = [{ name = "x", shape = [2, 16] }]
    ''')
    other = (cfg.parent / "tinylib" / "other.py").read_text()
    (cfg.parent / "tinylib" / "twin.py").write_text("# the same model, another module\n" + other)
    return cfg
