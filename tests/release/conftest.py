"""The release tests' project: the tiny project with a picky model, built once per module, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project
from tests.helpers.releases import ACTOR, PICKY, PICKY_CONFIG


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A tiny project with tiny fp32/p1 and bf16/p1 built (4 compiles), shared by the module's tests:
    each test works on a copy (:func:`proj`)."""
    root = tmp_path_factory.mktemp("release") / "proj"
    cfg = write_tiny_project(root, extra=PICKY_CONFIG)
    (root / "tinylib" / "picky.py").write_text(PICKY)
    r = run_cli("build", "-c", str(cfg), "-n", "2", "tiny/*/fp32/p1", "tiny/*/bf16/p1")
    assert r.returncode == 0, r.stdout + r.stderr
    return cfg


@pytest.fixture
def proj(built, tmp_path, monkeypatch) -> Path:
    """A private copy of the built project (keys do not depend on the path, so it is fully cached)."""
    monkeypatch.setenv("NEURON_BUILD_ACTOR", ACTOR)
    dest = tmp_path / "proj"
    shutil.copytree(built.parent, dest, ignore=shutil.ignore_patterns(".neuron-build", "__pycache__"))
    return dest / "buckets.toml"

