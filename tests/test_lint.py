"""The code passes the project's lint configuration (``[tool.ruff]`` in pyproject.toml)."""

from __future__ import annotations

import re
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


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / f for f in out if (REPO / f).suffix in {".py", ".md", ".toml", ".yml", ".json", ".txt", ""}
            and (REPO / f).is_file()]


def test_no_merge_conflict_is_left_in_a_tracked_file():
    markers = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    left = [f"{p.relative_to(REPO)}:{t.count(chr(10), 0, m.start()) + 1}"
            for p in tracked_text_files() for t in [p.read_text(errors="replace")] for m in [markers.search(t)] if m]
    assert left == []


def test_the_readmes_links_resolve():
    """mkdocs --strict checks the links inside docs/; the README's relative links are checked here."""
    readme = (REPO / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t and not t.startswith("#")]
    assert targets, "the README links into docs/"
    assert [t for t in targets if not (REPO / t).exists()] == []
