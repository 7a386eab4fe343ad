"""The registry: per model, the channels and the release each holds, the promotion / refusal / rollback
timeline, and every release with its gates, validation and benchmark figures per bucket.

Domain code: no doit, no torch. :func:`registry_doc` assembles the JSON document that ``report --json``
prints under ``registry`` and that :mod:`neuron_build.evaluate.registry` draws into ``report --html``: one
document, so the page and the JSON cannot disagree. Everything is read through the store contract
(``releases``, ``channel``, ``history``, ``manifest``, ``results``); a record of another shape is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neuron_build.release.diff import bucket_figures, gate_verdicts
from neuron_build.release.records import get_history, get_pointer, releases_of
from neuron_build.status import Verdict
from neuron_build.store.contract import ArtifactStore


def _timeline(histories: dict[str, list]) -> list[dict[str, Any]]:
    rows = []
    for c, hist in histories.items():
        for e in hist:
            failed = [g.get("name") for g in e.gates or [] if isinstance(g, dict) and g.get("passed") is False]
            waived = [g.get("name") for g in e.gates or [] if isinstance(g, dict) and g.get("verdict") == Verdict.WAIVED]
            rows.append({"time": e.time, "channel": c, "action": e.action, "from": e.from_, "to": e.to,
                         "version": e.version, "who": e.who, "reason": e.reason,
                         "refused": (e.refused or "").splitlines()[0] if e.refused else None,
                         "failed_gates": failed, "waived_gates": waived})
    return sorted(rows, key=lambda r: r["time"] or "")  # stable: ties (whole seconds) keep channel order


def model_registry(store: ArtifactStore, settings, model: str, current: set[str]) -> dict[str, Any]:
    """The registry of one model (see :func:`registry_doc`)."""
    channels = list(settings.channels)
    extra = sorted({c for m, c, _ in store.channels() if m == model and c not in channels})
    channels += extra  # a channel the store holds that the config no longer declares is still shown
    rows = []
    for c in channels:
        p = get_pointer(store, model, c)
        rows.append({"channel": c, "declared": c in settings.channels, "release": p.release if p else None,
                     "version": p.version if p else None, "action": p.action if p else None,
                     "time": p.time if p else None, "who": p.who if p else None})
    holding: dict[str, list[str]] = {}
    for r in rows:
        if r["release"]:
            holding.setdefault(r["release"], []).append(r["channel"])
    histories = {c: get_history(store, model, c) for c in channels}  # read once: each is a listing on S3
    releases = []
    for rel in releases_of(store, model):
        buckets = []
        for art in rel.artifacts:
            side = bucket_figures(store, rel, art)
            buckets.append({"bucket_id": art.bucket_id, "in_matrix": art.target in current, **side})
        releases.append({"id": rel.id, "dtype": rel.dtype, "profile": rel.profile, "backend": rel.backend,
                         "hardware_target": rel.hardware_target, "created": rel.created, "creator": rel.creator,
                         "git_commit": rel.git_commit, "toolchain": rel.toolchain,
                         "channels": holding.get(rel.id, []),
                         "rolled_back": sorted(({"channel": c, "time": e.time, "who": e.who, "reason": e.reason}
                                                for c, hist in histories.items() for e in hist
                                                if e.action == "rollback" and e.from_ == rel.id),
                                               key=lambda r: r["time"] or ""),
                         "gates": gate_verdicts(store, rel, channels, histories), "buckets": buckets})
    return {"model": model, "channels": rows, "timeline": _timeline(histories), "releases": releases}


def registry_doc(store: ArtifactStore, settings, models: Iterable[str], current: Iterable[str]) -> dict[str, Any]:
    """The registry of ``models`` (and of any other model the store holds releases of).

    Args:
        settings: the project's ``[release]`` (:class:`neuron_build.project.config.ReleaseSettings`).
        current: the target ids of the current matrix; a release's bucket whose target is not among them is
            marked ``in_matrix: false``.

    Returns:
        ``{"models": [{"model", "in_config", "channels": [{"channel", "declared", "release", "version",
        "action", "time", "who"}], "timeline": [{"time", "channel", "action", "from", "to", "version", "who",
        "reason", "refused", "failed_gates", "waived_gates"}], "releases": [{"id", "dtype", "profile",
        "backend", "created", "channels", "rolled_back" (``[{"channel", "time", "who", "reason"}]``, as
        :func:`neuron_build.release.channels.rollbacks_of`), "gates", "buckets": [{"bucket_id", "target", "key",
        "in_matrix", "op_count", "compile_time_s" (s), "artifact_bytes" (bytes), "validation": {kind:
        {"verdict", "error"}}, "bench": {name: {"p50_ms", "p99_ms"}}}]}]}]}``; releases oldest first.
    """
    names = list(dict.fromkeys(models))
    known = set(names)
    stored = sorted({m for m, _, _ in store.releases()} - known)
    cur = set(current)
    out = []
    for m in names + stored:
        doc = model_registry(store, settings, m, cur)
        if m in known or doc["releases"]:
            out.append({"model": doc.pop("model"), "in_config": m in known, **doc})
    return {"models": out}


__all__ = ["model_registry", "registry_doc"]
