"""Reads the recorder used not to see at all (issue 37), each driven through :class:`ReadRecorder` and
:class:`InputCheck` in-process: a folder listing (a new shard a glob matches), bytes-level environment access,
a child process or a connection of project code (the record is incomplete, never a hit), files outside the
project (weights under ``~/``), a Python file run but not imported, a module imported from a folder outside
the project, a native read through a file symlink re-pointed later, and a file read then rewritten with the
same bytes. Each test fails on the recorder before issue 37."""

from __future__ import annotations

import glob
import hashlib
import http.server
import importlib.util
import os
import sys
import threading
from pathlib import Path

import pytest

from neuron_build.project.reads import InputCheck, ReadRecorder


def sha(f: Path) -> str:
    return hashlib.sha256(Path(f).read_bytes()).hexdigest()


def recorded(root: Path, rec: ReadRecorder) -> dict:
    """The manifest's record of ``rec``: each input with its digest now (as the builder writes it)."""
    names = {"files": sorted(rec.files), "listings": sorted(rec.listings), "env": sorted(rec.env)}
    out = InputCheck(root.resolve(), os.environ, sha).current(names)
    if rec.incomplete:
        out["incomplete"] = rec.incomplete
    return out


def stale(root: Path, record: dict) -> list[str]:
    return InputCheck(root.resolve(), os.environ, sha).stale(record)


def project_module(root: Path, name: str, source: str):
    """A module of the project (its file under ``root``), loaded as the worker loads a factory."""
    path = root / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


LIST = {
    "os.listdir": lambda d: os.listdir(d),
    "os.scandir": lambda d: [e.name for e in os.scandir(d)],
    "os.walk": lambda d: list(os.walk(d)),
    "glob.glob": lambda d: glob.glob(os.path.join(d, "shard-*.bin")),
    "Path.glob": lambda d: list(Path(d).glob("shard-*.bin")),
}


@pytest.mark.parametrize("how", sorted(LIST))
def test_a_listed_folder_is_recorded_and_a_new_shard_makes_the_record_stale(tmp_path, how):
    root = tmp_path / "proj"
    (root / "ckpt").mkdir(parents=True)
    (root / "ckpt" / "shard-0.bin").write_bytes(b"0")
    with ReadRecorder(root) as rec:
        LIST[how](str(root / "ckpt"))
    assert rec.listings == {"ckpt"}
    rec_ = recorded(root, rec)
    assert stale(root, rec_) == []
    (root / "ckpt" / "shard-1.bin").write_bytes(b"1")  # the glob now matches two shards
    assert stale(root, rec_) == ["recorded listing ckpt changed"]


def test_the_import_systems_own_listings_are_no_read(tmp_path):
    """Importing a module lists the folders of ``sys.path`` (the project's, in the worker): no input, or every
    file added beside ``buckets.toml`` would rebuild every target."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "helper_mod_x1.py").write_text("X = 1\n")
    sys.path.insert(0, str(root))
    try:
        with ReadRecorder(root) as rec:
            import importlib.metadata

            import helper_mod_x1  # noqa: F401
            importlib.metadata.distributions()  # lists every sys.path folder
            list(importlib.metadata.distributions())
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("helper_mod_x1", None)
    assert rec.listings == set() and rec.files == set()


def test_bytes_level_environment_reads_are_recorded(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    root.mkdir()
    monkeypatch.setenv("NB_ESC_B", "1")
    monkeypatch.setenv("NB_ESC_G", "1")
    mod = project_module(root, "envf", "import os\n\ndef build():\n"
                                       "    return os.environb[b'NB_ESC_B'], os.getenvb(b'NB_ESC_G'), os.getenv('NB_ESC_S')\n")
    with ReadRecorder(root) as rec:
        mod.build()
    assert rec.env == {"NB_ESC_B", "NB_ESC_G", "NB_ESC_S"}
    rec_ = recorded(root, rec)
    monkeypatch.setenv("NB_ESC_G", "2")
    assert stale(root, rec_) == ["recorded variable NB_ESC_G changed"]


CHILD = {
    "subprocess.run": "subprocess.run(['true'], check=True)",
    "os.system": "os.system('true')",
    "os.posix_spawn": "os.waitpid(os.posix_spawn('/bin/true', ['true'], dict(os.environ)), 0)",
}


@pytest.mark.parametrize("how", sorted(CHILD))
def test_a_child_process_of_project_code_makes_the_record_incomplete(tmp_path, how):
    root = tmp_path / "proj"
    root.mkdir()
    mod = project_module(root, "childf", f"import os, subprocess\n\ndef build():\n    {CHILD[how]}\n")
    with ReadRecorder(root) as rec:
        mod.build()
    assert rec.incomplete is not None and "child process" in rec.incomplete and "true" in rec.incomplete
    assert "inputs_from" in rec.incomplete and "always_rebuild" in rec.incomplete
    assert stale(root, recorded(root, rec)) == [f"its build's reads were not fully recorded ({rec.incomplete})"]


def test_a_child_process_of_an_installed_library_is_not_the_factorys(tmp_path):
    """torch's inductor runs the C++ compiler in child processes: installed code's, not the factory's."""
    root = tmp_path / "proj"
    root.mkdir()
    site = tmp_path / "venv" / "site-packages"
    site.mkdir(parents=True)
    (site / "fakecc.py").write_text("import subprocess\n\ndef compile():\n    subprocess.run(['true'], check=True)\n")
    spec = importlib.util.spec_from_file_location("fakecc", site / "fakecc.py")
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)
    with ReadRecorder(root) as rec:
        lib.compile()
    assert rec.incomplete is None


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"2.0"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_factory_fed_over_the_network_is_never_a_hit(tmp_path):
    """The value a loopback HTTP server hands the factory is seen by no recorder: the record is incomplete
    (rebuilt by every build, the fresh gate catches a changed value), never ``cached`` silently."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/scale"
    root = tmp_path / "proj"
    root.mkdir()
    mod = project_module(root, "netf", "import urllib.request\n\ndef build(url):\n"
                                       "    return float(urllib.request.urlopen(url, timeout=10).read())\n")
    try:
        with ReadRecorder(root) as rec:
            assert mod.build(url) == 2.0
    finally:
        server.shutdown()
        server.server_close()
    assert rec.incomplete is not None and "connection" in rec.incomplete and "127.0.0.1" in rec.incomplete
    assert stale(root, recorded(root, rec)) != []


def test_reads_outside_the_project_are_recorded_by_home_relative_or_absolute_name(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file, save_file

    home, data, site = tmp_path / "home", tmp_path / "data", tmp_path / "venv" / "lib" / "site-packages"
    for d in (home / "ckpt", data, site):
        d.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "proj"
    root.mkdir()
    (home / "ckpt" / "scale.txt").write_text("2.0")
    save_file({"w": torch.ones(4)}, str(home / "ckpt" / "w.safetensors"))
    (data / "bias.bin").write_bytes(b"1")
    (site / "installed.txt").write_text("a distribution's file")
    with ReadRecorder(root) as rec:
        (home / "ckpt" / "scale.txt").read_text()
        w = load_file(str(home / "ckpt" / "w.safetensors"))  # native: mapped, no audit event
        (data / "bias.bin").read_bytes()
        (site / "installed.txt").read_text()
    assert rec.files == {"~/ckpt/scale.txt", "~/ckpt/w.safetensors", str(data.resolve() / "bias.bin")}
    assert w["w"].sum() == 4 and rec.scan_s < 0.5
    rec_ = recorded(root, rec)
    assert stale(root, rec_) == []
    save_file({"w": torch.full((4,), 2.0)}, str(home / "ckpt" / "w.safetensors"))
    (data / "bias.bin").write_bytes(b"2")
    assert stale(root, rec_) == [f"recorded read {data.resolve() / 'bias.bin'} changed",
                                 "recorded read ~/ckpt/w.safetensors changed"]


def test_a_file_native_code_holds_open_outside_the_project_is_recorded(tmp_path, monkeypatch):
    """A handle native code opened (libc's ``open``: no audit event, no watched folder) and keeps while the
    block ends is a read; one it holds open for writing is an output."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    home = tmp_path / "home"
    (home / "ckpt").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (home / "ckpt" / "w.bin").write_bytes(b"w")
    root = tmp_path / "proj"
    root.mkdir()
    with ReadRecorder(root) as rec:
        rfd = libc.open(str(home / "ckpt" / "w.bin").encode(), os.O_RDONLY)
        wfd = libc.open(str(home / "out.log").encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert rfd >= 0 and wfd >= 0
        assert rec.files == {"~/ckpt/w.bin"}
    finally:
        os.close(rfd)
        os.close(wfd)


def test_an_outside_name_is_hashed_only_when_it_is_a_regular_file(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (tmp_path / "w.bin").write_bytes(b"w")
    os.mkfifo(tmp_path / "fifo")
    check = InputCheck(root, {"HOME": str(tmp_path)}, sha)
    assert check.file(str(tmp_path / "w.bin")) == check.file("~/w.bin") == sha(tmp_path / "w.bin")
    assert check.file(str(tmp_path / "fifo")) == "missing"  # never opened: a fifo would block the check
    assert check.file("/dev/zero") == check.file("/proc/self/environ") == "missing"
    assert check.file("~/../w.bin") == check.file(f"{tmp_path}/x/../w.bin") == "missing"


def test_a_python_file_run_but_not_imported_is_a_recorded_read(tmp_path):
    import runpy

    root = tmp_path / "proj"
    root.mkdir()
    (root / "conf.py").write_text("SCALE = 2\n")
    (root / "conf2.py").write_text("SCALE = 3\n")
    (root / "imported_x2.py").write_text("X = 1\n")
    sys.path.insert(0, str(root))
    try:
        with ReadRecorder(root) as rec:
            runpy.run_path(str(root / "conf.py"))
            exec(open(root / "conf2.py").read(), {})
            import imported_x2  # noqa: F401  (an import: recorded as such, not as a read)
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("imported_x2", None)
    assert rec.files == {"conf.py", "conf2.py"}
    rec_ = recorded(root, rec)
    (root / "conf.py").write_text("SCALE = 5\n")
    assert stale(root, rec_) == ["recorded read conf.py changed"]


def test_a_module_imported_from_a_folder_outside_the_project_is_recorded(tmp_path, monkeypatch):
    from neuron_build.project.sources import recorded_files

    root = tmp_path / "proj"
    root.mkdir()
    lib = tmp_path / "somelib"
    lib.mkdir()
    (lib / "outlib_x3.py").write_text("K = 1\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.syspath_prepend(str(lib))
    import outlib_x3

    try:
        got = recorded_files([outlib_x3, os, pytest], root)
    finally:
        sys.modules.pop("outlib_x3", None)
    assert got == [str(lib.resolve() / "outlib_x3.py")]  # not the standard library's, not an installed one's
    check = InputCheck(root, os.environ, sha)
    assert check.file(got[0]) == sha(lib / "outlib_x3.py")


def test_a_native_read_through_a_file_symlink_is_recorded_under_the_links_name(tmp_path):
    """``ckpt/w.bin -> /data/w1.bin``: the kernel reports the open in ``/data``, a folder of no project; the
    link is recorded, so pointing it at other weights makes the record stale."""
    import torch

    root = tmp_path / "proj"
    (root / "ckpt").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "w1.bin").write_bytes(bytes(4))
    (data / "w2.bin").write_bytes(bytes([1, 2, 3, 4]))
    (root / "ckpt" / "w.bin").symlink_to(data / "w1.bin")
    with ReadRecorder(root) as rec:
        torch.from_file(str(root / "ckpt" / "w.bin"), size=4, dtype=torch.uint8)  # C++: no audit event
    assert rec.files == {"ckpt/w.bin"} and rec.incomplete is None  # (not /data/w1.bin: the link names it)
    rec_ = recorded(root, rec)
    (root / "ckpt" / "w.bin").unlink()
    (root / "ckpt" / "w.bin").symlink_to(data / "w2.bin")
    assert stale(root, rec_) == ["recorded read ckpt/w.bin changed"]


def test_a_file_read_then_rewritten_with_the_same_bytes_stays_an_input(tmp_path):
    import torch

    root = tmp_path / "proj"
    root.mkdir()
    (root / "w.bin").write_bytes(bytes(4))
    with ReadRecorder(root) as rec:
        torch.from_file(str(root / "w.bin"), size=4, dtype=torch.uint8)  # native read
        fd = os.open(root / "w.bin", os.O_WRONLY | os.O_TRUNC)  # the factory rewrites it, same bytes
        os.write(fd, bytes(4))
        os.close(fd)
        (root / "out.bin").write_bytes(b"an output")  # created, never read: no input
    assert rec.files == {"w.bin"}
    rec_ = recorded(root, rec)
    (root / "w.bin").write_bytes(bytes([9, 9, 9, 9]))  # a later real change
    assert stale(root, rec_) == ["recorded read w.bin changed"]


def test_a_file_opened_for_reading_and_writing_is_read(tmp_path):
    """``open(f, "r+b")`` and ``os.open(f, O_RDWR)`` read what the file held: inputs, unlike ``"w+"``."""
    root = tmp_path / "proj"
    root.mkdir()
    for name in ("rplus.bin", "rdwr.bin", "wplus.bin"):
        (root / name).write_bytes(b"x")
    with ReadRecorder(root, native=False) as rec:
        with open(root / "rplus.bin", "r+b") as f:
            f.read()
        os.close(os.open(root / "rdwr.bin", os.O_RDWR))
        with open(root / "wplus.bin", "w+b") as f:
            f.write(b"y")
    assert rec.files == {"rplus.bin", "rdwr.bin"}


def test_a_record_of_an_unknown_kind_is_never_a_hit(tmp_path):
    """A kind a newer recorder wrote and this version cannot check fails closed."""
    assert InputCheck(tmp_path, {}, sha).stale({"files": {}, "sockets": {"x": "y"}}) == [
        "its recorded inputs hold kinds this version cannot check (sockets)"]


def test_the_exempt_places_are_listed_in_the_docs():
    from neuron_build.project.outside import NOT_RECORDED_OUTSIDE
    from tests.helpers.cli import REPO

    doc = (REPO / "docs" / "key.md").read_text()
    section = doc[doc.index("## Reads outside the project"):]
    assert all(f"- {ex.what}" in section for ex in NOT_RECORDED_OUTSIDE)

