"""The code passes the project's lint configuration (``[tool.ruff]`` in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import REPO


def test_ruff_passes():
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    r = subprocess.run([exe, "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
