"""The fresh capture: is the artifact the store holds for a target what a build from today's source and
environment would produce? What ``neuron-build verify --fresh`` and the ``fresh`` promotion gate ask.

The first-level key trusts the inputs a factory was *recorded* reading (:mod:`neuron_build.project.reads`);
what no recorder sees (a value fetched over the network, a file read by native code outside every watched
folder) can change the graph while every recorded input stays the same. :func:`fresh_check` does not trust
the record: it runs the graph probe (:func:`neuron_build.build.graph.probe.run_probe`: ``python -m
neuron_build.worker --graphs``, one subprocess per model build, each target's backend run up to its graph key,
nothing compiled, no graph index asked) and compares each target's fresh graph key with the ``graph_key``
recorded in the manifest of the artifact checked:

- the artifact of the target's current first-level key, else the target's last built artifact (its target
  record; ``source`` says which), or for the gate the release's artifact of the target;
- ``fresh``: the keys are equal; ``differs``: they are not, with the ``component`` that differs: ``graph``
  when the graph's canonical document differs (its digest, which manifests record), ``graph key`` when only
  what the key adds to the document (shapes, compiler flags, toolchain) does, ``weights`` when the graph
  key (the structure) is the same but the artifact keeps its weights apart (``weights = "external"``) and
  the weights file the probe staged differs from the artifact's (a graph key of structure never holds the
  weight values: without this a new checkpoint fed past the recorder would read as fresh);
- ``unverifiable``: the target's backend makes no graph key before compiling (``graph_key`` ``none`` or
  ``after`` in :mod:`neuron_build.backends`), or its artifact records none: never passed silently;
- ``unchecked``: the probe could not key the target (the model does not build, the probe failed or timed
  out; ``reason``): not proven fresh (fail closed);
- ``unbuilt``: the store holds no artifact for the target (nothing to compare with).

No torch in this process; the probe's log is kept in ``<state>/graph-probe/fresh-<group>.log``.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.build.executor import compile_request
from neuron_build.build.graph import probe as graph_probe
from neuron_build.compilers import graph_key, weights
from neuron_build.util import file_sha256
from neuron_build.workspace import Workspace

#: Verdicts of one target (see the module docstring); ``differs`` and ``unchecked`` are not fresh.
VERDICTS = ("fresh", "differs", "unverifiable", "unchecked", "unbuilt")


@dataclass
class FreshRow:
    """One target's verdict: the artifact checked (``key``, where it came from: ``source``), the recorded
    and the fresh graph keys, the ``component`` that differs and the ``reason`` in one line."""

    target: str
    verdict: str
    key: str | None = None
    source: str | None = None
    component: str | None = None
    recorded_graph_key: str | None = None
    fresh_graph_key: str | None = None
    reason: str = ""

    def line(self) -> str:
        """``DIFFERS  target  graph: ...`` (one line for the terminal)."""
        what = f"{self.component}: " if self.component else ""
        return f"{self.verdict.upper():12} {self.target}  {what}{self.reason}"


@dataclass
class FreshReport:
    """Every target's :class:`FreshRow` and one entry per probe run (``model``, ``targets``, ``seconds``,
    ``exit``)."""

    rows: list[FreshRow] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    def of(self, verdict: str) -> list[FreshRow]:
        """The rows with ``verdict``."""
        return [r for r in self.rows if r.verdict == verdict]

    @property
    def clean(self) -> bool:
        """No target differs and every probed target was keyed (unverifiable and unbuilt ones are listed,
        not failed)."""
        return not self.of("differs") and not self.of("unchecked")

    def to_json(self) -> dict[str, Any]:
        """``{"targets": [row...], "probes": [...], "counts": {verdict: n}, "clean"}``."""
        return {"targets": [asdict(r) for r in self.rows], "probes": self.probes,
                "counts": {v: len(self.of(v)) for v in VERDICTS}, "clean": self.clean}


def _artifact(ws: Workspace, target: Any, given: dict[str, str] | None) -> tuple[str | None, str]:
    """The artifact key to check for ``target`` and where it came from."""
    if given is not None:
        return given.get(target.id), "release"
    ki = ws.key(target)
    if ws.store.is_complete(ki.key):
        return ki.key, "current"
    rec = ws.store.target(target.id)
    if rec is not None and ws.store.manifest(rec.key) is not None:
        return rec.key, "last built (the current key has no artifact)"
    return None, "none"


def _plan(ws: Workspace, targets: list[Any], given: dict[str, str] | None, scratch: Path
          ) -> tuple[list[FreshRow], dict[str, list[tuple[FreshRow, Any, Any]]]]:
    """Rows decided without a probe, and the probe requests grouped by model build."""
    from neuron_build.backends import get_backend

    done: list[FreshRow] = []
    groups: dict[str, list[tuple[FreshRow, Any, Any]]] = {}
    for t in targets:
        key, source = _artifact(ws, t, given)
        row = FreshRow(t.id, "unbuilt", key, source)
        m = ws.store.manifest(key) if key else None
        if m is None:
            row.reason = "the store holds no artifact for it; build it first"
            done.append(row)
            continue
        ki = ws.key(t)
        req = compile_request(ws, t, ki, scratch / "out" / ki.key[:16], scratch / ki.key[:16])
        spec = get_backend(req.backend)
        row.recorded_graph_key = m.graph_key
        if spec.graph_key != "before":
            row.verdict, row.reason = "unverifiable", f"backend {req.backend} keys no graph before compiling: " \
                                                      f"{spec.graph_key_why}"
        elif not m.graph_key:
            row.verdict, row.reason = "unverifiable", "its artifact records no graph key"
        else:
            req.options[graph_key.OPTION] = {"base": graph_key.base_of(ki.details), "probe": True}
            Path(req.work_dir).mkdir(parents=True, exist_ok=True)
            Path(req.out_dir).mkdir(parents=True, exist_ok=True)  # external weights are written there first
            groups.setdefault(graph_probe.group_of(req), []).append((row, req, m))
            continue
        done.append(row)
    return done, groups


def _weights_differ(m: Any, staged: Path) -> str | None:
    """Why the weights the probe staged in ``staged`` are not the external-weights artifact's (manifest
    ``m``), or None (they are the same bytes, or the artifact holds its weights inline)."""
    if (m.compiler or {}).get("weights") != "external":
        return None
    try:
        specs = weights.read_specs(staged)
    except ValueError as e:
        return str(e)
    if not specs:
        return "the probe staged no weights file to compare with the artifact's"
    for name in sorted(specs):
        held = m.files.get(name)
        path = staged / name
        fresh = file_sha256(path) if path.is_file() else None
        if held is None or fresh != held.sha256:
            return (f"a fresh build makes other weight values ({name} sha256 {(fresh or 'none')[:12]}; the artifact "
                    f"holds {(held.sha256 if held else 'none')[:12]}); the same graph structure)")
    return None


def _judge(row: FreshRow, got: dict[str, Any], m: Any, why: str, staged: Path) -> FreshRow:
    """``row`` with its verdict from the probe's answer ``got`` for it (``m``: the artifact's manifest;
    ``staged``: the probe's output folder, where it staged external weights)."""
    row.fresh_graph_key = got.get("graph_key")
    recorded_document = m.graph_document
    if not row.fresh_graph_key:
        row.verdict, row.reason = "unchecked", f"the probe made no graph key: {got.get('reason') or why}"[:300]
    elif row.fresh_graph_key == row.recorded_graph_key:
        row.verdict, row.reason = "fresh", f"graph key {row.fresh_graph_key[:12]}"
        differ = _weights_differ(m, staged)
        if differ is not None:
            row.verdict, row.component, row.reason = "differs", "weights", differ[:300]
    else:
        doc = got.get("graph_document")
        row.verdict = "differs"
        row.component = "graph" if (not recorded_document or doc != recorded_document) else "graph key"
        held = (row.recorded_graph_key or "?")[:12]
        row.reason = (f"a fresh build makes graph key {row.fresh_graph_key[:12]}; artifact {(row.key or '?')[:12]} "
                      f"holds {held}" + ("" if row.component == "graph"
                                         else " (same graph document: shapes, flags or toolchain differ)"))
    return row


def fresh_check(ws: Workspace, targets: list[Any], artifacts: dict[str, str] | None = None) -> FreshReport:
    """Re-capture the graph key of each of ``targets`` (one probe per model build) and compare it with the
    artifact's (see the module docstring).

    Args:
        ws: the opened project (:class:`~neuron_build.workspace.Workspace`).
        targets: the targets to check (matrix order is kept).
        artifacts: target id -> the artifact key to check (a release's); None: the store's artifact of each
            target (its current key, else its last built one).
    """
    folder = ws.project.make_state_dir() / graph_probe.PROBE_DIR
    scratch = Path(tempfile.mkdtemp(prefix="fresh-", dir=folder.parent if folder.parent.is_dir() else None))
    folder.mkdir(parents=True, exist_ok=True)
    report = FreshReport()
    try:
        done, groups = _plan(ws, targets, artifacts, scratch)
        judged: dict[str, FreshRow] = {r.target: r for r in done}
        timeout = float(ws.project.config.build.timeout_s)
        for group, items in groups.items():
            reqs = [req for _, req, _ in items]
            raw, _, status, seconds = graph_probe.run_probe(reqs, folder, f"fresh-{group[:24]}", timeout)
            report.probes.append({"model": items[0][0].target.split("/")[0], "targets": len(reqs),
                                  "seconds": round(seconds, 2), "exit": status})
            why = raw.get("error") or (f"the probe {'timed out' if status is None else f'exited with status {status}'}"
                                       f"; its log: {folder / f'fresh-{group[:24]}.log'}")
            answers = raw.get("targets") or {}
            for row, req, m in items:
                got = answers.get(req.key) if isinstance(answers.get(req.key), dict) else {}
                judged[row.target] = _judge(row, got, m, why, Path(req.out_dir))
        report.rows = [judged[t.id] for t in targets if t.id in judged]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return report


__all__ = ["VERDICTS", "FreshReport", "FreshRow", "fresh_check"]
