"""One line, no traceback: a missing AWS profile in every remote command, and the commands that write
records (release, promote, validate, bench) on a read-only store folder used by an unprivileged user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import write_tiny_project
from tests.helpers.store import OTHER, with_build

REMOTE = "s3://nb-no-such-bucket/cache"
REMOTE_COMMANDS = [
    ("build", OTHER), ("push",), ("fetch",), ("pull", "tiny", "--channel", "prod", "--dest", "DEST"), ("plan",),
    ("ls",), ("releases", "tiny"), ("channels",), ("history", "tiny", "--channel", "prod"), ("gc",), ("verify",),
]


@pytest.fixture
def aws_files(tmp_path, monkeypatch) -> Path:
    """An AWS config file that defines one profile, ``team``; no other AWS setting of the host leaks in."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "aws-config"
    cfg.write_text("[profile team]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return cfg


@pytest.mark.parametrize("where", ["AWS_PROFILE", "remote_options"])
@pytest.mark.parametrize("cmd", REMOTE_COMMANDS, ids=lambda c: c[0])
def test_a_missing_aws_profile_is_one_line_in_every_remote_command(tmp_path, aws_files, monkeypatch, cmd, where):
    cfg = write_tiny_project(tmp_path / "p")
    with_build(cfg, f'remote = "{REMOTE}"' + ('\nremote_options = { profile = "nope" }' if where != "AWS_PROFILE" else ""))
    if where == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "nope")
    args = [str(tmp_path / "dest") if a == "DEST" else a for a in cmd]
    r = run_cli(*args, "-c", str(cfg), timeout=120)
    source = "AWS_PROFILE" if where == "AWS_PROFILE" else "[build] remote_options.profile (buckets.toml)"
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"error: {REMOTE}: AWS profile 'nope' (set by {source}) is not defined in {aws_files} or "
                        f"{tmp_path / 'aws-credentials'} (profiles there: team); create it with `aws configure "
                        f"--profile nope`, or set {source} to a profile that exists\n"), r.stderr
    assert "Traceback" not in r.stdout


def test_an_existing_profile_passes_the_check(aws_files, monkeypatch):
    from neuron_build.store.aws_profile import profile_problem

    assert profile_problem(REMOTE, {"profile": "team"}) is None
    monkeypatch.setenv("AWS_PROFILE", "team")
    assert profile_problem(REMOTE, {}) is None
    assert profile_problem(REMOTE, {"profile": "other"}).startswith(f"{REMOTE}: AWS profile 'other' (set by [build]")


def as_nobody(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "neuron_build.cli", *args, "-c", str(cfg)]
    if os.geteuid() == 0:  # root ignores permissions: run as nobody, as test_store_errors does
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", HOME=str(cfg.parent))
    return subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=300)


def tree(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_size if p.is_file() else -1 for p in root.rglob("*")}


def test_release_promote_validate_and_bench_on_a_read_only_store_are_one_line():
    shared = Path(tempfile.mkdtemp(prefix="nb-ro-", dir="/tmp"))  # pytest's tmp folders are private
    try:
        os.chmod(shared, 0o755)
        cfg = write_tiny_project(shared / "p", extra='\n[release]\nchannels = ["dev", "prod"]\n')
        r = run_cli("build", OTHER, "-c", str(cfg))
        assert r.returncode == 0, r.stdout + r.stderr
        store = cfg.parent / "artifacts"
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "65534:65534", str(cfg.parent)], check=True)

        def lock() -> dict[str, int]:
            subprocess.run(["find", str(store), "-type", "d", "-exec", "chmod", "555", "{}", "+"], check=True)
            return tree(store)

        def check(r, command: str, what: str) -> None:
            assert r.returncode == 2, r.stdout + r.stderr
            assert r.stderr.endswith(
                f"error: store {store} is read-only: `neuron-build {command}` writes {what} into it; make it writable "
                f"(or run as a user who may write it), or point [build] store (buckets.toml) at a "
                f"writable store\n"), r.stderr
            assert len(r.stderr.splitlines()) <= 2 and "Traceback" not in r.stdout + r.stderr

        before = lock()
        check(as_nobody(cfg, "release", "other"), "release", "a release record")
        check(as_nobody(cfg, "validate", "other"), "validate", "validation results")
        check(as_nobody(cfg, "bench", "other"), "bench", "benchmark results")
        assert tree(store) == before
        subprocess.run(["chmod", "-R", "u+w", str(store)], check=True)
        r = as_nobody(cfg, "release", "other", "-q")
        assert r.returncode == 0, r.stdout + r.stderr
        rid = r.stdout.strip()
        before = lock()
        check(as_nobody(cfg, "promote", "other", rid, "--to", "dev", "--allow-unvalidated",
                        "--reason", "read-only test"), "promote",
              "the channel pointer and its history")
        assert tree(store) == before
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(shared)], check=False)
        shutil.rmtree(shared, ignore_errors=True)


def test_report_and_metrics_into_a_folder_or_an_unwritable_path_are_one_line(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    (tmp_path / "file").write_text("x")
    cases = [(["report", "--html", str(tmp_path)], f"error: --html {tmp_path}: is a folder; give a file name, e.g. "
              f"{tmp_path / 'report.html'}"),
             (["report", "--html", str(tmp_path / "file" / "x.html")], f"error: --html {tmp_path / 'file' / 'x.html'}: "
              "cannot be written ("),
             (["metrics", "-o", str(tmp_path)], f"error: --output {tmp_path}: is a folder; give a file name")]
    for args, want in cases:
        r = run_cli("-c", str(cfg), *args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(want), (args, r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "p"]  # nothing left beside them
