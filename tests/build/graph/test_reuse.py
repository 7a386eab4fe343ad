"""The builder's graph reuse (:mod:`neuron_build.build.graph.reuse`) driven through an executor that answers
as the worker does: a hit publishes the new key over the source artifact's blobs by ``Store.publish_as``,
hashing each file once; a source blob that does not verify is not reused (the target compiles)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections import Counter
from pathlib import Path

from neuron_build.build.builder import Builder
from neuron_build.build.executor import WORKER_LOG, CompileRun
from neuron_build.compilers import graph_key
from neuron_build.project.config import load_project
from neuron_build.status import Status
from neuron_build.store import graph_index, layout, ledger
from neuron_build.workspace import Workspace
from tests.helpers.hashing import hash_spy
from tests.helpers.projects import twin_project

GK = hashlib.sha256(b"the graph").hexdigest()
DOC = hashlib.sha256(b"the graph's canonical document").hexdigest()
OTHER, TWIN = "other/static/fp32/p1", "twin/static/fp32/p1"
CONTENT = {"model.pt": b"compiled" * 500, "aux/consts.bin": b"\x05" * 40}


class GraphWorker:
    """Answers as the worker does: a target whose id is in ``hits`` reports a graph index hit (unless the
    builder asked again with ``no_reuse``); every other run writes ``CONTENT`` and reports the graph key."""

    def __init__(self, hits: set[str]):
        self.hits, self.runs = hits, []

    def run(self, request, work_dir: Path, log) -> CompileRun:
        asked = request.options.get(graph_key.OPTION) or {}
        hit = request.target in self.hits and not asked.get("no_reuse")
        self.runs.append((request.target, "hit" if hit else "compile"))
        result = {"graph_key": GK, "graph_document": DOC, "op_count": 3, "op_count_source": "fake"}
        if hit:
            result["graph_hit"] = True
        else:
            for name, data in CONTENT.items():
                (Path(request.out_dir) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(request.out_dir) / name).write_bytes(data)
        return CompileRun(exit_code=0, wall_s=0.25, peak_rss_bytes=1, timed_out=False,
                          log=f"{request.target}: {'hit' if hit else 'compiled'}\n".encode(), result=result)


def twin_builder(tmp_path: Path, hits: set[str]) -> Builder:
    """A builder of the tiny project plus model ``twin`` (model ``other``'s module under another name: another
    source key, the same inputs), with the graph key on and a :class:`GraphWorker`."""
    cfg = twin_project(tmp_path)
    b = Builder(Workspace(load_project(cfg)), executor=GraphWorker(hits))
    assert b.graph.on()
    return b


def test_a_graph_hit_publishes_over_the_source_blobs_and_hashes_each_file_once(tmp_path, monkeypatch):
    b = twin_builder(tmp_path, hits={TWIN})
    first = b.build(b.ws.by_id[OTHER])
    assert (first.status, first.compiled) == (Status.PASS, True) and graph_index.lookup(b.ws.store, GK).key == first.key
    seen = hash_spy(monkeypatch)
    second = b.build(b.ws.by_id[TWIN])
    assert (second.status, second.compiled, second.reason) == (Status.PASS, False, f"graph unchanged: reused {first.key}")
    m, src = b.ws.store.manifest(second.key), b.ws.store.manifest(first.key)
    assert (m.reused_from, m.graph_key, m.graph_document) == (first.key, GK, DOC)
    assert {n: e.sha256 for n, e in m.files.items()} == {n: e.sha256 for n, e in src.files.items()}
    assert set(m.logs) == {WORKER_LOG} and m.logs[WORKER_LOG] != src.logs[WORKER_LOG]
    # each file of the new artifact hashed once: the source's blobs verified, the worker log digested
    assert Counter(seen) == Counter(e.sha256 for e in (*m.files.values(), *m.logs.values())) and len(seen) == 3
    assert b.ws.store.lookup(second.key, deep=True).hit
    assert {n: (b.ws.store.artifact_dir(second.key) / n).read_bytes() for n in CONTENT} == CONTENT
    assert b.ws.store.log_file(second.key, WORKER_LOG).read_bytes() == f"{TWIN}: hit\n".encode()
    assert [(r.target, r.event) for r in ledger.read(b.ws.store)] == [(OTHER, "compile"), (TWIN, "graph-reused")]


def test_a_source_blob_that_does_not_verify_is_not_reused_the_target_compiles(tmp_path):
    """Fail closed: a blob of the indexed artifact rotted (same size, another digest). Publishing the twin over
    it would pin the rot under a second key; the twin compiles instead and its artifact verifies."""
    b = twin_builder(tmp_path, hits={TWIN})
    first = b.build(b.ws.by_id[OTHER])
    blob = b.ws.store.path(layout.blob_path(b.ws.store.manifest(first.key).files["model.pt"].sha256))
    os.chmod(blob, 0o644)
    rotted = bytearray(blob.read_bytes())
    rotted[5] ^= 0x01
    blob.write_bytes(bytes(rotted))
    second = b.build(b.ws.by_id[TWIN])
    assert (second.status, second.compiled) == (Status.PASS, True), second.reason
    assert b.executor.runs == [(OTHER, "compile"), (TWIN, "hit"), (TWIN, "compile")]
    m = b.ws.store.manifest(second.key)
    assert m.reused_from is None and m.graph_key == GK
    assert b.ws.store.lookup(second.key, deep=True).hit  # the rebuild's bytes replaced the rotted blob
    assert (b.ws.store.artifact_dir(second.key) / "model.pt").read_bytes() == CONTENT["model.pt"]
    assert [(r.target, r.event) for r in ledger.read(b.ws.store)] == [(OTHER, "compile"), (TWIN, "compile")]


class RelinkWorker(GraphWorker):
    """As :class:`GraphWorker`, with ``weights = "external"``: a compile writes the weights apart (seed 0) and
    takes 30 s; a hit stages new weight values (seed 1) and takes 0.5 s."""

    def run(self, request, work_dir: Path, log) -> CompileRun:
        import torch

        from neuron_build.compilers import weights

        run = super().run(request, work_dir, log)
        hit = bool(run.result.get("graph_hit"))
        weights.write(request.out_dir, {"fc.weight": torch.full((3, 16), 1.0 if hit else 0.0)})
        if not hit:
            run.result["details"] = {"weights": "external"}
        return dataclasses.replace(run, wall_s=0.5 if hit else 30.0)


def test_a_relinked_artifact_keeps_the_compile_time_and_records_the_relinks_own(tmp_path, capsys):
    """A relink recorded its own seconds as ``compile_time_s``: the release's compile-time gate and ``show``
    saw a 0.5 s compile where the compiled files took 30 s. Now ``compile_time_s`` is the source's compile,
    ``relink_time_s`` the relink's, and ``show`` says what it was relinked from, as ``explain`` does."""
    from neuron_build.build.graph.relink import RELINKED
    from neuron_build.cli import main
    from neuron_build.release.create import artifact_summary

    b = Builder(Workspace(load_project(twin_project(tmp_path))), executor=RelinkWorker({TWIN}))
    first = b.build(b.ws.by_id[OTHER])
    second = b.build(b.ws.by_id[TWIN])
    assert (second.status, second.compiled, second.reason) == (Status.PASS, False, RELINKED.format(source=first.key))
    m = b.ws.store.manifest(second.key)
    assert m.relinked_from == first.key and m.files["model.pt"] == b.ws.store.manifest(first.key).files["model.pt"]
    assert (m.metrics.compile_time_s, m.metrics.relink_time_s) == (30.0, 0.5)
    assert artifact_summary(b.ws.store, second.key, m)["compile_time_s"] == 30.0  # what the compile-time gate reads
    assert main(["show", second.key, "-c", str(tmp_path / "proj" / "buckets.toml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "compile  30.0 s, peak 0 MiB" in out
    assert f"graph    weights changed, graph unchanged: relinked from {first.key} in 0.5 s" in out


class TimedWorker(GraphWorker):
    """As :class:`GraphWorker`: a compile takes 30 s, a graph hit (capture up to the graph key) 0.5 s."""

    def run(self, request, work_dir: Path, log) -> CompileRun:
        run = super().run(request, work_dir, log)
        return dataclasses.replace(run, wall_s=0.5 if run.result.get("graph_hit") else 30.0)


def test_a_graph_reuse_keeps_the_compile_time_and_records_its_own(tmp_path, capsys):
    """As a relink: a graph reuse recorded its capture's seconds as ``compile_time_s``."""
    from neuron_build.cli import main

    b = Builder(Workspace(load_project(twin_project(tmp_path))), executor=TimedWorker({TWIN}))
    first, second = b.build(b.ws.by_id[OTHER]), b.build(b.ws.by_id[TWIN])
    m = b.ws.store.manifest(second.key)
    assert m.reused_from == first.key and (m.metrics.compile_time_s, m.metrics.reuse_time_s) == (30.0, 0.5)
    assert main(["show", second.key, "-c", str(tmp_path / "proj" / "buckets.toml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "compile  30.0 s, peak 0 MiB" in out
    assert f"graph    source changed, graph unchanged: reused {first.key} in 0.5 s" in out
