"""The graph key, the second level of the key, as the builder uses it (:mod:`neuron_build.compilers.graph_key`
makes it in the worker): ask the worker for it, hold its compile lock, index a published artifact under it,
and publish a new key over the blobs of the artifact compiled from the same graph (or, for external
weights, its compiled files plus the new weights: :mod:`neuron_build.build.graph.relink`).

The graph index is untrusted input: a reuse is published only when the candidate's manifest records the same
graph key, canonical document digest, backend, hardware target, dtype and inputs (:func:`reuse_refused`),
and its blobs verify; whatever does not, compiles.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from neuron_build.build.attempt import BuildContext, disk_full
from neuron_build.build.executor import WORKER_LOG, CompileRun
from neuron_build.build.graph import relink
from neuron_build.build.graph.gate import GraphGate
from neuron_build.build.manifests import artifact_manifest, hash_files
from neuron_build.compilers import graph_key
from neuron_build.compilers.base import CompileRequest
from neuron_build.project.config import Project
from neuron_build.status import Status
from neuron_build.store import graph_index
from neuron_build.store.contract import ArtifactStore
from neuron_build.store.manifest import Manifest
from neuron_build.util import utc_now

#: Set to 0 (or false, no, off) to turn the graph key off for one build (benchmarks, a suspected bad reuse).
GRAPH_KEY_ENV = "NEURON_BUILD_GRAPH_KEY"


_Hit = TypeVar("_Hit", bound="GraphHit")


@dataclass(frozen=True)
class GraphHit:
    """The target's graph key found in the graph index before anything compiled: all a graph reuse takes,
    whoever found it, the compile worker (its run's result says ``graph_hit``: :meth:`of_run`) or the graph
    probe (:class:`~neuron_build.build.graph.probe.ProbeHit`). Untrusted: :meth:`GraphReuse.reuse` checks the
    index entry and the candidate's manifest against it.

    Attributes:
        graph_key: the graph key (sha256 hex; "" when the worker reported none: the reuse refuses it).
        graph_document: the sha256 hex of the graph's canonical document, or None when not reported (the
            reuse refuses it).
        imported: the project files the model's build imported (project-relative POSIX paths, or outside
            names), as the worker's ``result.json`` lists them.
        reads: the factory's recorded reads (``{"files", "listings", "env", "dists", "incomplete",
            "digests"}``: :class:`~neuron_build.worker.WorkerReads`), or None when none were recorded.
        seconds: wall time of the run that found it (the worker's; the probe's share per target), seconds.
        log: that run's log (the new artifact's ``worker.log``), bytes.
        peak_rss_bytes: that run's peak resident memory, bytes (0 when unknown, as for the probe).
        exit_code: that run's exit status, recorded as the artifact's ``metrics.exit_code`` (0: a worker's
            run with a result, the only one :meth:`of_run` sees; the probe's hit records 0 too).
    """

    graph_key: str
    graph_document: str | None
    imported: tuple[str, ...]
    reads: dict[str, Any] | None
    seconds: float
    log: bytes
    peak_rss_bytes: int = 0
    exit_code: int = 0

    @classmethod
    def from_result(cls: type[_Hit], result: dict[str, Any], seconds: float, log: bytes, peak_rss_bytes: int = 0,
                    exit_code: int = 0) -> _Hit:
        """The hit ``result`` names (untrusted JSON: a worker's ``result.json`` or a probe result, with
        ``graph_key``, ``graph_document``, ``imported`` and ``reads``; a value of another type counts as
        absent) and the run's ``seconds``, ``log`` (bytes), ``peak_rss_bytes`` and ``exit_code``."""
        gk, doc, imported, reads = (result.get(k) for k in ("graph_key", "graph_document", "imported", "reads"))
        return cls(graph_key=gk if isinstance(gk, str) else "", graph_document=doc if isinstance(doc, str) else None,
                   imported=tuple(i for i in imported if isinstance(i, str)) if isinstance(imported, list) else (),
                   reads=reads if isinstance(reads, dict) else None, seconds=float(seconds), log=log,
                   peak_rss_bytes=peak_rss_bytes, exit_code=exit_code)

    @classmethod
    def of_run(cls, run: CompileRun) -> GraphHit | None:
        """The graph hit a compile worker reported (its ``result.json`` has ``graph_hit``), or None (it
        compiled). ``run`` has passed :func:`~neuron_build.build.attempt.classify` (exit 0, a result)."""
        result = run.result or {}
        if not result.get("graph_hit"):
            return None
        return cls.from_result(result, run.wall_s, run.log, run.peak_rss_bytes, run.exit_code or 0)


@dataclass(frozen=True)
class Reused:
    """A graph reuse just published: ``source`` is the key whose artifact (blobs) the new key shares,
    ``graph_key`` the graph key both record, ``metrics`` the new manifest's metrics."""

    source: str
    graph_key: str
    metrics: dict[str, Any]
    #: the new weights were published with the source's compiled files (:mod:`neuron_build.build.graph.relink`)
    relinked: bool = False


def reuse_refused(ctx: BuildContext, req: CompileRequest, gk: str | None, document: str | None,
                  candidate: Manifest | None) -> str | None:
    """Why the artifact ``candidate`` (the manifest a graph index entry names) cannot stand for the graph
    ``gk`` with canonical document digest ``document`` of ``ctx``'s target, or None when it can: the
    manifest must record the same graph key and document digest (an artifact without them is never
    reused), and the same backend, hardware target, dtype and input shapes and dtypes. The entry and
    the manifest are untrusted input: an entry naming another graph's artifact is stale."""
    if candidate is None:
        return "the artifact has no manifest"
    want = {"graph key": gk, "graph document": document, "backend": req.backend,
            "hardware target": req.hardware_target, "dtype": ctx.target.dtype,
            "inputs": ctx.ki.details.get("inputs")}
    got = {"graph key": candidate.graph_key, "graph document": candidate.graph_document,
           "backend": candidate.backend, "hardware target": candidate.hardware_target,
           "dtype": candidate.dtype, "inputs": (candidate.key_details or {}).get("inputs")}
    if not gk or not document:
        return "this graph has no graph key or document digest"
    differ = [k for k in want if want[k] != got[k]]
    return f"its manifest records another {', '.join(differ)}" if differ else None


class GraphReuse:
    """The graph key of one builder's compiles.

    Args:
        project: the loaded config (``[build] graph_key``, ``heartbeat_s``).
        store: the store the builder publishes into (its graph index, its artifacts).
        provenance: the builder's extra manifest fields (see :class:`~neuron_build.build.builder.Builder`).
    """

    def __init__(self, project: Project, store: ArtifactStore, provenance: dict[str, Any]):
        self.project = project
        self.store = store
        self.provenance = provenance

    def on(self) -> bool:
        """Is the graph key on: ``[build] graph_key`` and not ``NEURON_BUILD_GRAPH_KEY=0``?"""
        env = os.environ.get(GRAPH_KEY_ENV, "").strip().lower()
        return bool(self.project.config.build.graph_key) and env not in ("0", "false", "no", "off")

    def ask(self, ctx: BuildContext, req: CompileRequest, work: Path) -> None:
        """Ask the worker for the graph key (:mod:`neuron_build.compilers.graph_key`): the source key's
        non-model components, and the graph keys the index holds now (``known-graphs.json`` in the
        workdir). A store whose index cannot be listed gives an empty list (the target compiles)."""
        if not self.on():
            return
        try:
            known = graph_index.known(self.store)
        except OSError as e:
            ctx.log.warning("could not list the graph index; compiling", error=str(e))
            known = []
        path = work / "known-graphs.json"
        path.write_text(json.dumps(known))
        req.options[graph_key.OPTION] = {"base": graph_key.base_of(ctx.ki.details), "known": str(path), "gate": True}

    def gate(self, ctx: BuildContext, req: CompileRequest, work: Path) -> Any:
        """The graph key's compile lock for this attempt (:class:`~neuron_build.build.graph.gate.GraphGate`),
        or a no-op context when the worker makes no graph key."""
        if graph_key.OPTION not in req.options:
            return contextlib.nullcontext()
        return GraphGate(self.store, work, ctx.target.id, self.project.config.build.heartbeat_s, ctx.log)

    def index(self, ctx: BuildContext, req: CompileRequest, gk: str | None, document: str | None) -> None:
        """Record graph key ``gk`` (of the canonical document with digest ``document``) -> the key just
        published in the graph index (an entry whose artifact is gone, or that :func:`reuse_refused`
        refuses, is replaced); best effort."""
        if not gk or not self.on():
            return
        entry = graph_index.GraphEntry(graph_key=gk, key=ctx.ki.key, target=ctx.target.id, backend=req.backend,
                                       time=utc_now())
        try:
            old = graph_index.lookup(self.store, gk)
            stale = old is not None and old.key != ctx.ki.key and (
                not self.store.is_complete(old.key)
                or reuse_refused(ctx, req, gk, document, self.store.manifest(old.key)) is not None)
            graph_index.record(self.store, entry, replace=stale or old is None)
        except (OSError, ValueError) as e:
            ctx.log.warning("could not record the graph key", graph_key=gk[:12], error=str(e))

    def _candidate(self, ctx: BuildContext, req: CompileRequest, hit: GraphHit) -> tuple[str, Manifest] | None:
        """(key, manifest) of the artifact the graph index hit names, or None (logged) when the
        entry is stale: no entry, its artifact is not complete here, or :func:`reuse_refused` refuses it."""
        gk = hit.graph_key
        entry = graph_index.lookup(self.store, gk) if gk else None
        found = self.store.repair(entry.key) if entry is not None else None
        # (a key's manifest is replaced when its recorded inputs went stale: the entry's key may hold
        # another graph's artifact now)
        if entry is None or found is None or not found.hit or found.manifest.graph_key != gk:
            ctx.log.warning("graph index entry is stale; compiling", graph_key=(gk or "")[:12])
            return None
        refused = reuse_refused(ctx, req, gk, hit.graph_document, found.manifest)
        if refused is not None:
            ctx.log.warning("graph index entry is stale; compiling", graph_key=gk[:12], candidate=entry.key[:12],
                            reason=refused)
            return None
        return entry.key, found.manifest

    def reuse(self, ctx: BuildContext, req: CompileRequest, hit: GraphHit, obj: Path,
              recorded_inputs: dict[str, Any]) -> Reused | None:
        """Publish ``ctx``'s key over the blobs of the artifact compiled from the same graph (``hit``: the
        worker or the probe found its graph key in the index) by
        :meth:`~neuron_build.store.core.Store.publish_as`: the manifest gets ``graph_key`` and
        ``reused_from``, nothing is compiled and no artifact file is copied. None when the entry is stale,
        or a blob of its artifact does not verify: the caller compiles.

        Raises:
            DiskFull: the file system filled up; nothing was published.
        """
        found = self._candidate(ctx, req, hit)
        if found is None:
            return None
        source, old = found
        gk = str(old.graph_key)
        if relink.staged(obj) or (old.compiler or {}).get("weights") == "external":
            done = relink.relink(self, ctx, req, hit, obj, source, old, recorded_inputs)
            return None if done is None else Reused(source, done[0], done[1], relinked=done[2])
        with disk_full("writing the artifact", obj):
            (obj / WORKER_LOG).write_bytes(hit.log)
        # compile_time_s stays the source's compile (as a relink's: build/graph/relink.py); the run's seconds
        # (capture up to the graph key) are the reuse's
        metrics = {**relink.carried_metrics(old), "status": Status.PASS, "reuse_time_s": round(hit.seconds, 3),
                   "peak_rss_bytes": hit.peak_rss_bytes, "exit_code": hit.exit_code, "attempts": ctx.attempt,
                   "reason": None}
        _, logs = hash_files(obj)  # the worker log: the artifact's files are the source's blobs
        manifest = artifact_manifest(
            ctx, req, {n: e.model_dump() for n, e in old.files.items()}, logs, metrics,
            toolchain=dict(old.toolchain), compiler=dict(old.compiler), graph_key=gk,
            graph_document=old.graph_document, reused_from=source if source != ctx.ki.key else old.reused_from,
            recorded_inputs=recorded_inputs, **self.provenance)
        with disk_full("writing the manifest", obj):
            self.store.seal(obj, manifest)
        try:
            with disk_full("publishing", obj):
                self.store.publish_as(obj, ctx.ki.key, source, replace=bool(ctx.stale))
        except ValueError as e:  # the source's blobs do not verify (or it went away): compile
            ctx.log.warning("graph index entry is stale; compiling", graph_key=gk[:12], candidate=source[:12],
                            reason=str(e))
            return None
        return Reused(source, gk, metrics)


__all__ = ["GRAPH_KEY_ENV", "GraphHit", "GraphReuse", "Reused", "reuse_refused"]
