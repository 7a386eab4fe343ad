"""The graph probe's answer under its own name (:class:`neuron_build.build.graph.probe.ProbeHit`): what
:func:`~neuron_build.build.graph.probe.probe_hit` returns on a hit (never a :class:`CompileRun`), None on each
miss, and the Builder taking it straight to the graph reuse (no worker, never classified), compiling with
``no_reuse`` when the index entry it names turns out stale. The probe's subprocess is replaced by an answer
(``run_probe``); its result files, lock and build stamp are the real ones."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from neuron_build.build import builder as builder_mod
from neuron_build.build.attempt import BuildContext
from neuron_build.build.builder import Builder
from neuron_build.build.executor import WORKER_LOG, CompileRun, compile_request
from neuron_build.build.graph import probe as graph_probe
from neuron_build.build.graph.probe import ProbeHit, probe_hit
from neuron_build.build.graph.reuse import GraphHit
from neuron_build.compilers import graph_key
from neuron_build.log import get_logger
from neuron_build.project.config import load_project
from neuron_build.status import Status
from neuron_build.store import graph_index, layout, ledger
from neuron_build.workspace import Workspace
from tests.build.graph.test_reuse import DOC, GK, OTHER, TWIN, GraphWorker, twin_builder

READS = {"files": ["tinylib/act.py"], "listings": [], "env": [], "dists": []}


class ProbeAnswer:
    """Stands for the probe's subprocess (``run_probe``): answers ``targets`` (first-level key -> its
    ``graph_key`` and ``graph_document``, or None: no graph key) for each request, or raises ``crash``."""

    def __init__(self, gk: str | None = GK, doc: str = DOC, crash: Exception | None = None, error: str = ""):
        self.gk, self.doc, self.crash, self.error, self.calls = gk, doc, crash, error, 0

    def __call__(self, reqs, folder: Path, name: str, timeout: float):
        self.calls += 1
        if self.crash is not None:
            raise self.crash
        if self.error:
            return {"error": self.error}, "probe log\n", 1, 0.5
        targets = {r.key: ({"graph_key": self.gk, "graph_document": self.doc} if self.gk else {"reason": "no key"})
                   for r in reqs}
        return {"targets": targets, "imported": ["tinylib/twin.py"], "reads": READS}, "probe log\n", 0, 0.5


def asked(b: Builder, target_id: str, changed: tuple[str, ...] = ("model",)) -> tuple[BuildContext, object]:
    """The build context and compile request of ``target_id`` as the Builder makes them before it asks the
    probe: the graph key option set, the model changed since the last build."""
    t = b.ws.by_id[target_id]
    ki = b.ws.key(t)
    ctx = BuildContext(t, ki, get_logger(target=t.id), changed=changed)
    req = compile_request(b.ws, t, ki, b.ws.project.state_dir / "obj", b.ws.project.state_dir / "work")
    req.options[graph_key.OPTION] = {"base": graph_key.base_of(ki.details)}
    return ctx, req


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A builder whose store holds OTHER's artifact under graph key GK (in the index)."""
    monkeypatch.delenv(graph_probe.PROBE_ENV, raising=False)
    b = twin_builder(tmp_path, hits=set())
    first = b.build(b.ws.by_id[OTHER])
    assert first.compiled and graph_index.lookup(b.ws.store, GK).key == first.key
    return b


def test_a_hit_is_a_probe_hit_with_the_probes_record_not_a_compile_run(built, monkeypatch):
    answer = ProbeAnswer()
    monkeypatch.setattr(graph_probe, "run_probe", answer)
    ctx, req = asked(built, TWIN)
    hit = probe_hit(built.ws, built.build_id, ctx, req)
    assert type(hit) is ProbeHit and isinstance(hit, GraphHit) and not isinstance(hit, CompileRun)
    assert (hit.graph_key, hit.graph_document, hit.imported, hit.reads) == (GK, DOC, ("tinylib/twin.py",), READS)
    assert (hit.seconds, hit.peak_rss_bytes, hit.exit_code) == (0.5, 0, 0)
    assert hit.log == f"probe log\ngraph probe: graph key {GK[:12]} is in the graph index: not compiling\n".encode()
    assert answer.calls == 1
    # used once: asked again in the same build, the result is gone, so the probe runs again
    assert probe_hit(built.ws, built.build_id, ctx, req) == hit and answer.calls == 2


def no_option(ctx, req, mp):
    del req.options[graph_key.OPTION]


def no_reuse(ctx, req, mp):
    req.options[graph_key.OPTION]["no_reuse"] = True


def keyed_in_the_compile(ctx, req, mp):
    req.backend = "neuron"


def probe_off(ctx, req, mp):
    mp.setenv(graph_probe.PROBE_ENV, "0")


def external_weights(ctx, req, mp):
    req.inline_weights_to_neff = False


MISSES = {
    "no graph key option": no_option,
    "no_reuse": no_reuse,
    "a backend keyed in the compile": keyed_in_the_compile,
    "the probe turned off": probe_off,
    "external weights": external_weights,
}


@pytest.mark.parametrize("why", sorted(MISSES))
def test_no_probe_for_a_target_it_cannot_answer(built, monkeypatch, why):
    answer = ProbeAnswer()
    monkeypatch.setattr(graph_probe, "run_probe", answer)
    ctx, req = asked(built, TWIN)
    MISSES[why](ctx, req, monkeypatch)
    assert probe_hit(built.ws, built.build_id, ctx, req) is None
    assert answer.calls == 0


def test_no_probe_for_a_target_whose_model_did_not_change(built, monkeypatch):
    """A new target, or new shapes, flags or toolchain: a new graph (its worker still asks the index)."""
    answer = ProbeAnswer()
    monkeypatch.setattr(graph_probe, "run_probe", answer)
    ctx, req = asked(built, TWIN, changed=("inputs", "toolchain"))
    assert probe_hit(built.ws, built.build_id, ctx, req) is None
    assert answer.calls == 0
    stale = BuildContext(ctx.target, ctx.ki, ctx.log, changed=("inputs",), stale=("tinylib/act.py changed",))
    assert probe_hit(built.ws, built.build_id, stale, req) is not None and answer.calls == 1


def unindexed_key(b: Builder) -> ProbeAnswer:
    return ProbeAnswer(gk=hashlib.sha256(b"a graph never compiled").hexdigest())


def incomplete_artifact(b: Builder) -> ProbeAnswer:
    """An index entry whose artifact is not in the store."""
    gk = hashlib.sha256(b"a graph whose artifact is gone").hexdigest()
    graph_index.record(b.ws.store, graph_index.GraphEntry(graph_key=gk, key="ab" * 32, target=OTHER,
                                                       backend="torchscript"), replace=True)
    return ProbeAnswer(gk=gk)


PROBE_MISSES = {
    "the probe crashed": lambda b: ProbeAnswer(crash=RuntimeError("boom")),
    "the probe failed": lambda b: ProbeAnswer(error="the model build failed"),
    "no graph key for the target": lambda b: ProbeAnswer(gk=None),
    "the graph key not in the index": unindexed_key,
    "the indexed artifact incomplete": incomplete_artifact,
}


@pytest.mark.parametrize("why", sorted(PROBE_MISSES))
def test_a_probe_without_a_complete_indexed_artifact_is_no_hit(built, monkeypatch, why):
    answer = PROBE_MISSES[why](built)
    monkeypatch.setattr(graph_probe, "run_probe", answer)
    ctx, req = asked(built, TWIN)
    assert probe_hit(built.ws, built.build_id, ctx, req) is None
    assert answer.calls == 1


def rebuilt_twin(b: Builder, monkeypatch, answer) -> Builder:
    """Build TWIN, then a graph-neutral edit of its module, and a new Builder (a new build) whose probe
    answers ``answer(b)`` (made now) and whose worker answers a graph hit for TWIN unless asked with
    ``no_reuse``."""
    assert b.build(b.ws.by_id[TWIN]).compiled
    src = b.ws.project.root / "tinylib" / "twin.py"
    src.write_text("# a graph-neutral edit\n" + src.read_text())
    monkeypatch.setattr(graph_probe, "run_probe", answer(b))
    return Builder(Workspace(load_project(b.ws.project.root / "buckets.toml")), executor=GraphWorker({TWIN}))


def test_the_builder_takes_a_probe_hit_by_name_to_the_reuse(built, monkeypatch):
    """No compile worker, nothing classified: the reuse's manifest records the probe's log, its share of
    the probe's seconds, no peak memory and exit 0, and its reads; the ledger says graph-reused."""
    b = rebuilt_twin(built, monkeypatch, lambda b: ProbeAnswer())

    def never(*a, **k):
        raise AssertionError("a probe hit is not a worker's run: never classified")

    monkeypatch.setattr(builder_mod, "classify", never)
    out = b.build(b.ws.by_id[TWIN])
    src = graph_index.lookup(b.ws.store, GK).key
    assert (out.status, out.compiled, out.reason) == (Status.PASS, False, f"graph unchanged: reused {src}")
    assert b.executor.runs == []
    m = b.ws.store.manifest(out.key)
    assert (m.reused_from, m.graph_key, m.graph_document) == (src, GK, DOC)
    src_m = b.ws.store.manifest(src)
    assert (m.metrics.compile_time_s, m.metrics.peak_rss_bytes, m.metrics.exit_code) == (
        src_m.metrics.compile_time_s, 0, 0)                          # the source's compile, not the probe's share
    assert m.metrics.model_dump()["reuse_time_s"] == 0.5
    assert "tinylib/act.py" in m.recorded_inputs["files"]
    assert b.ws.store.log_file(out.key, WORKER_LOG).read_text().startswith("probe log\ngraph probe: graph key")
    assert [(r.target, r.event) for r in ledger.read(b.ws.store)][-1] == (TWIN, "graph-reused")


def rot_the_source_blob(b: Builder) -> ProbeAnswer:
    """The indexed artifact's blob rotted (same size, another digest): complete to the probe, refused by the
    reuse's publish (its blobs verify)."""
    blob = b.ws.store.path(layout.blob_path(b.ws.store.manifest(graph_index.lookup(b.ws.store, GK).key).files["model.pt"].sha256))
    os.chmod(blob, 0o644)
    rotted = bytearray(blob.read_bytes())
    rotted[5] ^= 0x01
    blob.write_bytes(bytes(rotted))
    return ProbeAnswer()


STALE = {
    "another graph document": lambda b: ProbeAnswer(doc=hashlib.sha256(b"another document").hexdigest()),
    "a rotted blob": rot_the_source_blob,
}


@pytest.mark.parametrize("why", sorted(STALE))
def test_a_probe_hit_whose_index_entry_is_stale_compiles(built, monkeypatch, why):
    """Fail closed: the probe finds the graph key in the index, the reuse refuses the entry; the target
    compiles in its own worker, asked with ``no_reuse`` (the worker would answer a graph hit otherwise)."""
    b = rebuilt_twin(built, monkeypatch, STALE[why])
    out = b.build(b.ws.by_id[TWIN])
    assert (out.status, out.compiled) == (Status.PASS, True), out.reason
    assert b.executor.runs == [(TWIN, "compile")]
    m = b.ws.store.manifest(out.key)
    assert m.reused_from is None and m.graph_key == GK
    assert b.ws.store.log_file(out.key, WORKER_LOG).read_bytes() == f"{TWIN}: compiled\n".encode()
    assert b.ws.store.lookup(out.key, deep=True).hit
    assert [(r.target, r.event) for r in ledger.read(b.ws.store)][-1] == (TWIN, "compile")
