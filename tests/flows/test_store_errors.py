"""A store that cannot be used (a file, a missing folder, a read-only folder, a --store that is no store), and
a bad ``[build] state_dir``: one line naming the location, what is wrong and the fix, exit 2; never a
traceback nor an empty failure reason."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from neuron_build.cli import main
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import write_tiny_project
from tests.helpers.store import OTHER, with_build


@pytest.fixture
def file_store(tmp_path: Path) -> Path:
    """A tiny project whose ``[build] store`` is an existing file ``sf``."""
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'store = "sf"')
    (cfg.parent / "sf").write_text("not a store\n")
    return cfg


def doit(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    """``doit -f dodo.py --dir <project> ARGS`` for the project of ``cfg``, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "--dir", str(cfg.parent), *args],
                          text=True, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NEURON_BUILD_CONFIG": str(cfg)})


@pytest.mark.parametrize("how", ["neuron-build", "doit"])
def test_a_store_that_is_a_file_is_one_line_exit_2_for_build(file_store, how):
    r = run_cli("build", OTHER, "-c", str(file_store), timeout=300) if how == "neuron-build" else doit(file_store, "build")
    sf = file_store.parent / "sf"
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"error: store {sf} is a file, not a folder; set [build] store (buckets.toml) "
                                f"to a folder")    # build has no --store option: not advised
    assert "Traceback" not in r.stdout + r.stderr and sf.read_text() == "not a store\n"


@pytest.mark.parametrize("command", [["ls"], ["verify"], ["verify", "--deep"], ["gc", "--dry-run"], ["plan"]])
def test_ls_verify_gc_refuse_a_store_that_is_a_file(file_store, capsys, command):
    rc = main([*command, "-c", str(file_store)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"error: store {file_store.parent / 'sf'} is a file, not a folder;" in err


def test_a_store_inside_a_file_is_refused(tmp_path, capsys):
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'store = "sf/artifacts"')
    (cfg.parent / "sf").write_text("x")
    assert main(["ls", "-c", str(cfg)]) == 2
    assert (f"error: store {cfg.parent / 'sf' / 'artifacts'} is inside {cfg.parent / 'sf'}, a file, not a folder"
            in capsys.readouterr().err)


@pytest.mark.parametrize("command", [["verify"], ["gc", "--dry-run"]])
def test_verify_and_gc_refuse_a_missing_store(tmp_path, capsys, command):
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'store = "typo"')
    rc = main([*command, "-c", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == (f"error: store {cfg.parent / 'typo'} does not exist (nothing was built into it); set "
                           "[build] store (buckets.toml) to the store's folder, or run `neuron-build build` first")
    assert not (cfg.parent / "typo").exists()


def test_a_read_only_store_that_must_be_written_fails_in_one_line(tmp_path):
    """A store this process may not write (here: opened read-only, as a read-only mount is): the target
    that needs compiling fails with one line naming the store and the target, nothing compiled."""
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.status import Status
    from neuron_build.store import open_store
    from neuron_build.workspace import Workspace

    cfg = write_tiny_project(tmp_path / "p")
    (cfg.parent / "artifacts").mkdir()
    project = load_project(cfg)
    b = Builder(Workspace(project, store=open_store(project.store_url(), read_only=True)))
    out = b.build(b.ws.by_id[OTHER])
    assert out.status == Status.ERROR and not out.compiled
    assert out.reason == (f"store {cfg.parent / 'artifacts'} is read-only: cannot compile {OTHER} into it; make it "
                          "writable, or set [build] store (buckets.toml) to a folder this user may write")
    assert not (cfg.parent / "artifacts" / "locks").exists()


def test_a_lock_the_file_system_refuses_is_the_read_only_line(tmp_path, monkeypatch):
    """``OSError: [Errno 30] Read-only file system`` taking the key's lock (a read-only mount)."""
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import load_project
    from neuron_build.status import Status
    from neuron_build.store.locks import KeyLock
    from neuron_build.workspace import Workspace

    cfg = write_tiny_project(tmp_path / "p")
    b = Builder(Workspace(load_project(cfg)))

    def refuse(self):
        raise OSError(errno.EROFS, "Read-only file system", str(self.path))

    monkeypatch.setattr(KeyLock, "acquire", refuse)
    out = b.build(b.ws.by_id[OTHER])
    store = cfg.parent / "artifacts"
    assert out.status == Status.ERROR
    assert out.reason.startswith(f"store {store} is read-only (Read-only file system: {store}/locks/")
    assert out.reason.endswith(f".lock): cannot compile {OTHER} into it; make it writable, or set [build] store "
                               "(buckets.toml) to a folder this user may write")


def test_an_unforeseen_error_is_named_in_the_summary(tmp_path, monkeypatch, capsys):
    """An exception with no message raised while building a target: the FAILED line names its type, never
    ``not built: `` and nothing."""
    from neuron_build.build.builder import Builder

    cfg = write_tiny_project(tmp_path / "p")

    def boom(self, target, retry_failed=True, **options):
        raise NotImplementedError()

    monkeypatch.setattr(Builder, "build", boom)
    rc = main(["build", OTHER, "-c", str(cfg)])
    out = capsys.readouterr()
    assert rc == 1
    assert f"FAILED {OTHER}: ERROR: NotImplementedError\n" in out.out + out.err


@pytest.mark.parametrize("make, why", [
    (None, "no such folder"),
    ("file", "a file, not a folder"),
    ("folder", "the folder holds none of ac/, cas/, releases/, channels/"),
])
def test_pull_from_a_store_path_that_holds_no_store_says_so(tmp_path, capsys, make, why):
    where = tmp_path / "store"
    if make == "file":
        where.write_text("x")
    elif make == "folder":
        (where / "models").mkdir(parents=True)
    rc = main(["pull", "minilm", "--channel", "prod", "--dest", str(tmp_path / "pp"), "--store", str(where)])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (f"error: --store {where}: no store there ({why}); give the folder or "
                                               "URL of the store the releases were promoted in")
    assert not (tmp_path / "pp").exists()


def test_pull_from_a_real_but_empty_store_still_names_the_channel(tmp_path, capsys):
    """A folder that is a store (it has ``channels/``) with nothing promoted: the channel's own message."""
    (tmp_path / "store" / "channels").mkdir(parents=True)
    rc = main(["pull", "minilm", "--channel", "prod", "--dest", str(tmp_path / "pp"), "--store", str(tmp_path / "store")])
    assert rc == 2 and "channel minilm/prod holds no release; promote one into it first" in capsys.readouterr().err


def test_a_state_dir_that_cannot_be_created_is_a_config_error(tmp_path, capsys):
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'state_dir = "/proc/nope"')
    assert main(["plan", "-c", str(cfg)]) == 2
    assert capsys.readouterr().err == (
        f"error: {cfg}: invalid configuration\n  build.state_dir: '/proc/nope' (/proc/nope): cannot create it (No such "
        "file or directory); set it to a folder this user may write (default \".neuron-build\")\n")


@pytest.mark.parametrize("how", ["plan", "doit"])
def test_a_state_dir_that_is_a_file_is_a_config_error(tmp_path, how):
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'state_dir = "sfile"')
    (cfg.parent / "sfile").write_text("x")
    if how == "plan":
        r = run_cli("plan", "-c", str(cfg))
    else:
        r = doit(cfg, "build")
    assert r.returncode == 2, r.stderr
    assert (f"  build.state_dir: 'sfile' ({cfg.parent / 'sfile'}) is a file, not a folder; set it to a folder "
            "(default \".neuron-build\")\n") in r.stderr
    assert "Traceback" not in r.stderr and (cfg.parent / "sfile").read_text() == "x"


def test_the_fix_for_a_flipped_byte_in_a_blob_is_one_that_works(tmp_path):
    """One byte of a blob flipped (same size): a build alone calls the target cached, so verify's fix names
    ``verify --deep --repair`` first; following it, the build compiles the target again and verify is clean."""
    import json

    from neuron_build.store import layout
    from neuron_build.store.local import LocalStore

    cfg = write_tiny_project(tmp_path / "p")
    c = ["-c", str(cfg)]
    assert run_cli("build", OTHER, *c).returncode == 0
    store = LocalStore(cfg.parent / "artifacts")
    man = json.loads(next((store.root / "ac").rglob("*.json")).read_text())
    blob = store.path(layout.blob_path(man["files"]["model.pt"]["sha256"]))
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))

    r = run_cli("verify", "--deep", "--json", *c)
    fix = json.loads(r.stdout)["bad"][0]["fix"]
    assert r.returncode == 1 and fix == ("`neuron-build verify --deep --repair` (moves the damaged blob to "
                                         f"quarantine/), then `neuron-build build {OTHER}` compiles it again")
    r = run_cli("build", OTHER, *c)
    assert "0 built, 1 cached" in r.stdout  # why a rebuild alone is not the fix
    assert run_cli("verify", "--deep", "--repair", *c).returncode == 1
    r = run_cli("build", OTHER, *c)
    assert r.returncode == 0 and "1 built, 0 cached" in r.stdout, r.stdout + r.stderr
    r = run_cli("verify", "--deep", *c)
    assert r.returncode == 0, r.stdout


def test_the_docs_say_what_a_url_as_build_store_does(tmp_path, capsys):
    """docs/store.md: ``[build] store`` is a folder and a URL there is refused, with the message the tool gives."""
    text = " ".join((REPO / "docs" / "store.md").read_text().split())
    assert "`[build] store` may itself be a URL" not in text
    assert ("`[build] store` is always a local folder (a shared file system mount works); a URL there is refused "
            "(`is a URL; [build] store is the local folder`). The shared store is `[build] remote = URL`") in text
    cfg = with_build(write_tiny_project(tmp_path / "p"), 'store = "s3://mybucket/neuron"')
    assert main(["plan", "-c", str(cfg)]) == 2
    assert ("build.store: 's3://mybucket/neuron' is a URL; [build] store is the local folder (such as \"artifacts\"; "
            "a shared file system mount works) and a shared store goes in [build] remote = 's3://mybucket/neuron'"
            in capsys.readouterr().err)


def test_a_read_only_store_folder_as_an_unprivileged_user_fails_in_one_line():
    """The store folder is ``chmod 0555`` and the build runs as an unprivileged user (``nobody`` when the tests
    run as root, who ignores permissions): a target to compile into it stops the build before any compile with
    the read-only line `promote` gives, no traceback, exit 2; a build of only cached targets still succeeds."""
    shared = Path(tempfile.mkdtemp(prefix="nb-ro-", dir="/tmp"))  # pytest's tmp folders are private
    try:
        os.chmod(shared, 0o755)
        cfg = write_tiny_project(shared / "p")
        store = cfg.parent / "artifacts"
        store.mkdir()
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", "65534:65534", str(cfg.parent)], check=True)
        store.chmod(0o555)
        cmd = [sys.executable, "-m", "neuron_build.cli", "build", OTHER, "-c", str(cfg)]
        if os.geteuid() == 0:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        r = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1"), text=True,
                           capture_output=True, timeout=300)
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr == (f"error: store {store} is read-only: `neuron-build build` writes artifacts into it; make "
                            f"it writable (or run as a user who may write it), or point [build] store (buckets.toml) "
                            f"at a writable store\n")
        assert "FAILED" not in r.stdout and "Traceback" not in r.stdout + r.stderr and list(store.iterdir()) == []
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(shared)], check=False)
        shutil.rmtree(shared, ignore_errors=True)
