"""Small defects a trial found through the CLI: each gets one line naming the flag, file or URL and the fix
(exit 2), or the right behaviour."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, write_tiny_project

ENV = {"PYTHONPATH": str(REPO)}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# -- report/metrics --since: "-3h" reads as "3h" (3 hours ago); a bad window is one line naming --since ----------
def test_since_accepts_a_leading_minus_and_names_its_forms(tmp_path: Path):
    cfg = write_tiny_project(tmp_path / "p")
    for args in (["report", "--since", "-3h", "--json"], ["report", "--since=-3h", "--json"]):
        r = run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=ENV)
        assert r.returncode == 0, r.stderr
        assert '"since"' in r.stdout and "usage:" not in r.stderr
    r = run_cli("metrics", "--since", "-2d", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "neuron_build_report_window_seconds 172800.0" in r.stdout.splitlines()
    r = run_cli("report", "--since", "3x", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2
    assert _one_line(r.stderr) == ("error: --since '3x' is not a window: give a positive number and a unit "
                                   "(s, m, h, d, w), e.g. 24h, 90m, 7d (-3h is read as 3h: 3 hours ago), or 'all'")
    # an option after --since is still a missing value, not a window
    r = run_cli("report", "--since", "--json", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2 and "argument --since: expected one argument" in r.stderr


# -- bench checks its options before it prints anything ---------------------------------------------------------
def test_bench_bad_iters_is_one_line_before_any_output(tmp_path: Path):
    cfg = write_tiny_project(tmp_path / "p")
    r = run_cli("bench", "--iters", "0", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line(r.stderr) == "error: --iters must be >= 1 and --warmup >= 0 (got iters 0, warmup 50)"
    r = run_cli("bench", "tiny", "--threads", "0", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line(r.stderr) == "error: --threads must be >= 1 (got 0)"


# -- releases diff of two models' releases is refused in one line -----------------------------------------------
def test_releases_diff_across_models_is_one_line(tmp_path: Path):
    cfg = edit(write_tiny_project(tmp_path / "p"), "buckets = { batch = [1, 4] }", "buckets = { batch = [1] }")
    ids = {}
    for model, target in (("tiny", "tiny/b1/fp32/p1"), ("other", "other/static/fp32/p1")):
        r = run_cli("build", target, "-c", str(cfg), cwd=cfg.parent, env=ENV)
        assert r.returncode == 0, r.stderr
        r = run_cli("release", model, "--dtype", "fp32", "--profile", "p1", "-c", str(cfg), cwd=cfg.parent, env=ENV)
        assert r.returncode == 0, r.stderr
        ids[model] = r.stdout.split()[1].rstrip(":")
    assert all(i.startswith("r-") for i in ids.values()), ids
    want = (f"error: releases diff: {ids['tiny']} is a release of model 'tiny' and {ids['other']} of model 'other'; "
            f"a diff compares two releases of one model (list them with `neuron-build releases tiny` or "
            f"`neuron-build releases other`)")
    r = run_cli("releases", "diff", ids["tiny"], f"other@{ids['other']}", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2 and r.stdout == ""
    assert _one_line(r.stderr) == want
    r = run_cli("releases", "diff", ids["tiny"], ids["other"], "--json", "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 2
    assert json.loads(r.stdout)["error"] == want.removeprefix("error: ")
    # one model's release against itself still diffs
    r = run_cli("releases", "diff", ids["tiny"], ids["tiny"], "-c", str(cfg), cwd=cfg.parent, env=ENV)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "0 changed, 1 same, 0 added, 0 removed"


# -- a remote whose filesystem cannot connect (ftp://) is one line naming [build] remote, not a traceback ---------
def test_unreachable_ftp_remote_is_one_line_naming_build_remote(tmp_path: Path):
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    schemes = "s3://, gs://, gcs://, az://, abfs://, file://, memory://"
    for url, reason in ((f"ftp://127.0.0.1:{port}/store", "ConnectionRefusedError: [Errno 111] Connection refused"),
                        ("ftp://nosuchhost.invalid/store", "gaierror: ")):
        cfg = write_tiny_project(tmp_path / url.split("/")[2].replace(":", "_"))
        edit(cfg, "[build]\n", f'[build]\nremote = "{url}"\n')
        for args in (["status", "--remote"], ["push"], ["build", "other"]):
            r = run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=ENV, timeout=120)
            assert r.returncode == 2, (args, r.stderr)
            line = _one_line(r.stderr)
            assert "Traceback" not in r.stderr
            assert line.startswith(f"error: [build] remote '{url}' cannot be opened: connecting failed ({reason}"), line
            assert line.endswith(f"); check the host and port in the URL, or use a store URL of one of {schemes}")
        assert not (cfg.parent / "artifacts" / "ac").exists()  # nothing was compiled or written
    # a deploy host's `pull --store URL` names the flag
    r = run_cli("pull", "tiny", "--channel", "dev", "--dest", str(tmp_path / "out"), "--store",
                f"ftp://127.0.0.1:{port}/store", cwd=tmp_path, env=ENV, timeout=120)
    assert r.returncode == 2 and not (tmp_path / "out").exists()
    assert _one_line(r.stderr) == (f"error: --store 'ftp://127.0.0.1:{port}/store' cannot be opened: connecting "
                                   f"failed (ConnectionRefusedError: [Errno 111] Connection refused); check the host "
                                   f"and port in the URL, or use a store URL of one of {schemes}")


# -- verify of the local cache of a file:// remote: a promoted channel's release lives on the remote ------------
def test_verify_local_cache_finds_a_channels_release_on_the_remote(tmp_path: Path):
    remote = tmp_path / "remote"
    cfg = edit(write_tiny_project(tmp_path / "p"), "buckets = { batch = [1, 4] }", "buckets = { batch = [1] }")
    edit(cfg, "[build]\n", f'[build]\nremote = "file://{remote}"\n')
    cfg.write_text(cfg.read_text() + '\n[release]\nchannels = ["dev"]\n')

    def nb(*args: str, ok: int = 0):
        r = run_cli(*args, "-c", str(cfg), cwd=cfg.parent, env=ENV)
        assert r.returncode == ok, (args, r.stdout, r.stderr)
        return r

    nb("build", "tiny/b1/fp32/p1")
    nb("validate", "tiny/b1/fp32/p1")
    rid = nb("release", "tiny", "--dtype", "fp32", "--profile", "p1").stdout.split()[1].rstrip(":")
    nb("promote", "tiny", rid, "--to", "dev")
    nb("push")
    local = cfg.parent / "artifacts"
    assert (local / "channels" / "tiny" / "dev.json").is_file()  # the mirrored pointer...
    assert not (local / "releases" / "tiny" / f"{rid}.json").exists()  # ...of a release only the remote holds
    for args in (["verify", "--json"], ["verify", "--remote", "--json"]):
        doc = json.loads(nb(*args).stdout)
        assert doc["verdict"] == "pass" and doc["problems"] == [], doc
    # a release missing from both stores is still a problem
    (remote / "releases" / "tiny" / f"{rid}.json").unlink()
    doc = json.loads(nb("verify", "--json", ok=1).stdout)
    assert doc["problems"] == [f"channels/tiny/dev.json: points at release {rid}, but releases/tiny/{rid}.json "
                               f"is missing or unreadable"]


# -- [build] store = "." would hold the models' sources: their files would drop out of the key ------------------
def test_store_in_the_project_folder_is_a_config_error(tmp_path: Path):
    cfg = write_tiny_project(tmp_path / "p")
    edit(cfg, "[build]\n", '[build]\nstore = "."\n')
    r = run_cli("build", "other", "-c", str(cfg), cwd=cfg.parent, env=ENV, timeout=120)
    assert r.returncode == 2, r.stderr
    header, line = r.stderr.strip().splitlines()  # the config error's header, then its one fault
    assert header == f"error: {cfg}: invalid configuration"
    line = line.strip()
    assert line.startswith("build.store: '.' (") and "is the project folder" in line, line
    assert line.endswith('set it to a folder beside the sources, e.g. "artifacts"'), line
    assert not (cfg.parent / "ac").exists()  # nothing was compiled into it
    edit(cfg, 'store = "."', 'store = "artifacts"')
    r = run_cli("explain", "other/static/fp32/p1", "--json", "-c", str(cfg), cwd=cfg.parent, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    model = next(c for c in json.loads(r.stdout)["components"] if c["name"] == "model")
    assert "tinylib/other.py" in model["new"]["sources"]


# -- pull: a model or channel name that cannot be one is a usage error, not a tampered record --------------------
def test_pull_bad_typed_name_is_a_usage_error(tmp_path: Path):
    store = tmp_path / "store"
    (store / "channels").mkdir(parents=True)
    rule = "may hold only ASCII letters, digits, '_', '.', '-' and must start with a letter or digit"
    for args, line in ((["../x", "--channel", "dev"], f"error: MODEL: model name '../x' {rule}"),
                       (["tiny", "--channel", "../../x"], f"error: --channel: channel name '../../x' {rule}")):
        r = run_cli("pull", *args, "--dest", str(tmp_path / "out"), "--store", str(store), cwd=tmp_path, env=ENV)
        assert r.returncode == 2, r.stderr
        assert _one_line(r.stderr) == line
        assert not (tmp_path / "out").exists()


# -- build of a missing target into a read-only store stops before any compile, as promote does -----------------
def test_build_of_a_missing_target_on_a_read_only_store_is_a_usage_error():
    shared = Path(tempfile.mkdtemp(prefix="nb-ro-", dir="/tmp"))  # pytest's tmp folders are private
    try:
        os.chmod(shared, 0o755)
        cfg = write_tiny_project(shared / "p")
        store = cfg.parent / "artifacts"
        assert run_cli("build", "other/static/fp32/p1", "-c", str(cfg), env=ENV).returncode == 0
        if os.geteuid() == 0:  # root ignores permissions: run as nobody
            subprocess.run(["chown", "-R", "65534:65534", str(cfg.parent)], check=True)
        subprocess.run(["find", str(store), "-type", "d", "-exec", "chmod", "555", "{}", "+"], check=True)
        files = sorted(p.relative_to(store).as_posix() for p in store.rglob("*"))

        def as_nobody(*args: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "neuron_build.cli", *args, "-c", str(cfg)]
            if os.geteuid() == 0:
                cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
            return subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1",
                                                HOME=str(cfg.parent)), text=True, capture_output=True, timeout=300)

        r = as_nobody("build", "other/static/fp32/p1")  # cached: nothing to write, still fine
        assert r.returncode == 0, r.stdout + r.stderr
        r = as_nobody("build", "tiny/b1/fp32/p1")
        assert r.returncode == 2, r.stdout + r.stderr
        assert _one_line(r.stderr) == (
            f"error: store {store} is read-only: `neuron-build build` writes artifacts into it; make it writable "
            f"(or run as a user who may write it), or point [build] store (buckets.toml) at a writable "
            f"store")
        assert "FAILED" not in r.stdout and "Traceback" not in r.stdout
        assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*")) == files
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(shared)], check=False)
        shutil.rmtree(shared, ignore_errors=True)
