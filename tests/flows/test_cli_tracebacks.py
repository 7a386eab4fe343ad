"""Inputs a trial found ending in a traceback (or an empty ``--json`` stdout, or exit 0): each now gives one
line naming the file, flag or URL and the fix, the README's exit code, and under ``--json`` one
``neuron-build/error/v1`` document on stdout."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from neuron_build.errors import ConfigError
from neuron_build.project.config import load_project
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, write_tiny_project

ERROR_SCHEMA = "neuron-build/error/v1"


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The run's single ``error: ...`` line (exit 2, no traceback)."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def error_document(r: subprocess.CompletedProcess) -> dict:
    """The run's one JSON document on stdout, an error/v1 with exit code 2."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)  # exactly one document: json.loads refuses trailing text
    assert doc["schema"] == ERROR_SCHEMA and doc["exit_code"] == 2
    return doc


def test_warmup_of_a_folder_that_is_not_a_pulled_release(tmp_path):
    missing = tmp_path / "nonexistent"
    line = one_line_error(run_cli("warmup", str(missing), cwd=tmp_path))
    assert line == (f"error: {missing}/release.json: cannot read it ([Errno 2] No such file or directory: "
                    f"'{missing}/release.json'); pull a release into {missing} with "
                    f"`neuron-build pull MODEL --channel C --dest {missing}`")
    r = run_cli("warmup", str(missing), "--json", cwd=tmp_path)
    assert error_document(r)["error"] == line.removeprefix("error: ")


def test_report_since_too_far_back_names_the_flag(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    for window in ("99999999999d", "999999d"):
        line = one_line_error(run_cli("report", "-c", str(cfg), "--since", window, cwd=tmp_path))
        assert line == (f"error: --since '{window}' reaches back further than dates go (before year 1): give a "
                        f"shorter window, e.g. 24h, 7d, or 'all' for every record")
    doc = error_document(run_cli("report", "-c", str(cfg), "--since", "99999999999d", "--json", cwd=tmp_path))
    assert doc["error"].startswith("--since '99999999999d' reaches back")


def test_unreadable_config_is_one_fault_naming_the_file(tmp_path, monkeypatch):
    cfg = write_tiny_project(tmp_path / "p")
    real = Path.read_bytes

    def denied(self):
        if self == cfg:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)
    monkeypatch.setattr(Path, "read_bytes", denied)  # root reads a chmod 000 file: make the read fail here
    with pytest.raises(ConfigError) as e:
        load_project(cfg)
    assert e.value.faults == [f"cannot read it (Permission denied); make it readable by this user (chmod u+r {cfg}) "
                              f"or pass -c PATH of a readable buckets.toml"]


def test_unreadable_config_through_the_cli():
    """A buckets.toml this user may not read (mode 000; as nobody when the tests run as root, who reads anyway)."""
    shared = Path(tempfile.mkdtemp(prefix="nb-unreadable-"))
    try:
        shared.chmod(0o755)
        path = write_tiny_project(shared / "p")
        path.parent.chmod(0o755)
        path.chmod(0)

        def plan(*extra: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "neuron_build.cli", "plan", "-c", str(path), *extra]
            if os.geteuid() == 0:
                cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
            return subprocess.run(cmd, cwd="/", text=True, capture_output=True, timeout=300,
                                  env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
                                           HOME=str(shared)))

        r = plan()
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.splitlines() == [f"error: {path}: invalid configuration",
                                         f"  cannot read it (Permission denied); make it readable by this user "
                                         f"(chmod u+r {path}) or pass -c PATH of a readable buckets.toml"]
        doc = error_document(plan("--json"))
        assert doc["error"].startswith(f"{path}: invalid configuration\n  cannot read it (Permission denied)")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_file_remote_that_is_a_file(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    afile = tmp_path / "afile"
    afile.write_text("not a store\n")
    url = f"file://{afile}"
    edit(cfg, "heartbeat_s = 1\n", f'heartbeat_s = 1\nremote = "{url}"\n')
    want = (f"error: [build] remote '{url}' is a file, not a folder ({afile} is a file); point [build] remote at a "
            f"folder (a new or existing store), e.g. file:///path/to/store")
    assert one_line_error(run_cli("push", "-c", str(cfg), cwd=tmp_path)) == want
    assert error_document(run_cli("push", "-c", str(cfg), "--json", cwd=tmp_path))["error"] == want[len("error: "):]
    # a folder below the file is no better
    edit(cfg, url, f"{url}/sub")
    assert "is a file, not a folder" in one_line_error(run_cli("push", "-c", str(cfg), cwd=tmp_path))
    assert afile.read_text() == "not a store\n"


def test_doit_negative_process_count_is_a_usage_error(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent),
                        "-n", "-2", "build", f"config={cfg}"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == ["ERROR: -n/--process -2: not a number of processes; give 0 (compile in "
                                             "this process) or a positive count, e.g. -n 2"]
    assert "failed" not in r.stdout


def test_push_json_to_an_unreachable_remote_prints_the_error_document(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    r = run_cli("build", "-c", str(cfg), "other", cwd=tmp_path)  # one torchscript compile: a push has work
    assert r.returncode == 0, r.stdout + r.stderr
    with socket.socket() as s:  # a port nobody listens on: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    edit(cfg, "heartbeat_s = 1\n", 'heartbeat_s = 1\nremote = "s3://nb-bucket/x"\n')
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    r = run_cli("push", "-c", str(cfg), "--json", cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == ERROR_SCHEMA and doc["exit_code"] == 1
    assert doc["error"].startswith(f"s3://nb-bucket/x: cannot reach the endpoint http://127.0.0.1:{port} ")
    assert f"error: {doc['error']}" in r.stderr.splitlines()


def test_dask_scheduler_address_without_a_port_is_one_line_and_nothing_after(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    r = run_cli("build", "-c", str(cfg), "--executor", "dask", "--scheduler", "bogus", cwd=tmp_path, timeout=120)
    # the half-made Client is closed at once: no "Exception ignored in: Client.__del__ ... TimeoutError" at exit
    assert one_line_error(r) == ("error: cannot reach the Dask scheduler at bogus (missing port number in address "
                                 "'bogus'); start it (dask scheduler), fix [build] scheduler or --scheduler, or build "
                                 "on this host with --executor local")
