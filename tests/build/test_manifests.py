"""The one manifest builder and the one hash of each staged file: :func:`hash_files` reads each file once, and a
build hashes each artifact file exactly once on its way into the store (the store stores it under that digest)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.build.executor import WORKER_LOG, CompileRun
from neuron_build.build.manifests import hash_files
from neuron_build.project.config import load_project
from neuron_build.status import Status
from neuron_build.workspace import Workspace
from tests.helpers.hashing import hash_spy


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WritingExecutor:
    """Writes ``files`` into the request's out_dir and returns a passing run."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.calls = files, 0

    def run(self, request, work_dir: Path, log) -> CompileRun:
        self.calls += 1
        for name, data in self.files.items():
            (Path(request.out_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(request.out_dir) / name).write_bytes(data)
        return CompileRun(exit_code=0, wall_s=0.5, peak_rss_bytes=1, timed_out=False, log=b"worker log\n",
                          result={"op_count": 2, "op_count_source": "fake"})


def test_hash_files_lists_files_and_logs_apart_and_reads_each_once(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    content = {"model.pt": b"w" * 300, "sub/extra.bin": b"\x00\x01", WORKER_LOG: b"hi\n", "compile.log": b"cc\n"}
    for name, data in content.items():
        (tmp_path / name).write_bytes(data)
    seen = hash_spy(monkeypatch)
    files, logs = hash_files(tmp_path)
    assert files == {"model.pt": {"sha256": sha(b"w" * 300), "size": 300},
                     "sub/extra.bin": {"sha256": sha(b"\x00\x01"), "size": 2}}
    assert logs == {"compile.log": {"sha256": sha(b"cc\n"), "size": 3}, WORKER_LOG: {"sha256": sha(b"hi\n"), "size": 3}}
    assert sorted(seen) == sorted(sha(d) for d in content.values())


def test_a_build_hashes_each_artifact_file_once_on_its_way_into_the_store(tiny, monkeypatch):
    """Issue 33 item 3: the builder hashed every file, then the store's put_blob hashed it again."""
    content = {"model.pt": b"weights" * 1000, "extra/table.bin": b"\x07" * 33, "compile.log": b"compiler says\n"}
    b = Builder(Workspace(load_project(tiny)), executor=WritingExecutor(content))
    t = b.ws.by_id["other/static/fp32/p1"]
    seen = hash_spy(monkeypatch)
    out = b.build(t)
    assert (out.status, out.compiled) == (Status.PASS, True), out.reason
    m = b.ws.store.manifest(out.key)
    assert set(m.files) == {"model.pt", "extra/table.bin"} and set(m.logs) == {"compile.log", WORKER_LOG}
    want = [e.sha256 for e in (*m.files.values(), *m.logs.values())]
    assert Counter(seen) == Counter(want) and len(seen) == 4  # each of the four files: once
    assert b.ws.store.lookup(out.key, deep=True).hit
    assert (b.ws.store.artifact_dir(out.key) / "extra" / "table.bin").read_bytes() == content["extra/table.bin"]
