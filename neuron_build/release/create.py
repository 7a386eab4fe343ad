"""Making a release: the targets of one model's dtype and profile chosen, each bucket's built artifact found and
checked, the draft record made from them (:class:`~neuron_build.release.records.Release`), and it recorded in the
store once. :func:`create_release` is that pipeline, one step a function, each returning what the next takes.

Domain code: no doit, no torch. The record's fields and the store layout are in :mod:`.records` and
``docs/releases.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from neuron_build.artifact import artifact_file
from neuron_build.errors import UserError
from neuron_build.project.config import INTEGER_DTYPES, Project
from neuron_build.project.keys import diff_components
from neuron_build.project.matrix import Target
from neuron_build.release.records import (
    RELEASE_FORMAT,
    Release,
    ReleaseArtifact,
    actor,
    find_release,
    git_state,
    release_id,
)
from neuron_build.status import Status
from neuron_build.store.contract import ArtifactStore
from neuron_build.util import canonical_json, percentile, utc_now
from neuron_build.workspace import Workspace


def _pick(what: str, given: str | None, allowed: tuple[str, ...], model: str, flag: str) -> str:
    if given is not None:
        if given not in allowed:
            raise UserError(f"model '{model}' is not built for {what} '{given}'; its {what}s in buckets.toml: "
                            f"{', '.join(allowed)}")
        return given
    if len(allowed) == 1:
        return allowed[0]
    raise UserError(f"model '{model}' has several {what}s ({', '.join(allowed)}); choose one with {flag}")


def require_model(project: Project, model: str) -> None:
    """Raise :class:`UserError` (listing the project's models) unless ``model`` is one of them."""
    if model not in project.config.models:
        raise UserError(f"unknown model '{model}' in {project.path}; models: {', '.join(project.config.models)}")


def release_candidates(ws: Workspace, target: Target) -> tuple[dict[str, str], str | None]:
    """The artifacts a bucket can be released from: ({toolchain JSON: key}, None), or ({}, problem).

    Candidates are the target's current key when the store holds it, and the key the target was last
    built with when that build passed and differs from this checkout only in the toolchain (a store filled
    by another host's toolchain). With neither, the bucket is missing or failed.
    """
    store: ArtifactStore = ws.store
    ki = ws.key(target)
    out: dict[str, str] = {}
    if store.is_complete(ki.key):
        out[canonical_json(ki.details["toolchain"]).decode()] = ki.key
    rec = store.target(target.id)
    stale: list[str] = []
    if rec and rec.status == Status.PASS and rec.key != ki.key and rec.details is not None \
            and store.is_complete(rec.key):
        changed = diff_components(rec.details, ki.details)
        if all(c.split(":")[0] == "toolchain" for c in changed):
            out.setdefault(canonical_json(rec.details["toolchain"]).decode(), rec.key)
        else:
            stale = changed
    if out:
        return out, None
    fail = store.failure(target.id)
    if fail and fail.key == ki.key:
        return {}, f"failed: {fail.status}: {fail.reason}".rstrip(": ")
    if stale:
        return {}, (f"missing: not built for this checkout (changed since its last build: {'; '.join(stale)}); "
                    f"{build_advice(ws, target.id)}")
    return {}, f"missing: not built (key {ki.key[:12]}); {build_advice(ws, target.id)}"


def build_advice(ws: Workspace, target_id: str) -> str:
    """How to build ``target_id`` for the workspace's backend: ``run `neuron-build build T``` when a plain build
    compiles for that backend, else first set ``[build] backend`` (``release --backend`` chose another)."""
    from neuron_build.project.toolchain import resolve_backend

    build = ws.project.config.build
    used = ws.keys.backend
    plain, _note = resolve_backend(build.backend, build.target)
    if plain == used:
        return f"run `neuron-build build {target_id}`"
    return (f"set [build] backend = \"{used}\" in {ws.project.path.name}, then run `neuron-build build "
            f"{target_id}` (a build now compiles for {plain})")


def _toolchain_text(tc_json: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(json.loads(tc_json).items()))


def artifact_summary(store: ArtifactStore, key: str, manifest) -> dict[str, Any]:
    """The metrics a release records per bucket: ``op_count``, ``op_count_source``, ``compile_time_s``
    (seconds), ``artifact_bytes`` and ``peak_rss_bytes`` (bytes), ``validation`` (device kind -> verdict)
    and ``bench`` (result name -> ``p50``/``p90``/``p99``/``mean`` in ms, ``throughput_per_s``)."""
    validation = {kind: r.get("verdict") for kind, r in store.results(key, "validation").items()}
    bench = {}
    for name, r in store.results(key, "bench").items():
        lat = r.get("latency_ms") or {}
        bench[name] = {k: lat.get(k) for k in ("p50", "p90", "p99", "mean") if k in lat}
        if "throughput_per_s" in r:
            bench[name]["throughput_per_s"] = r["throughput_per_s"]
    mt = manifest.metrics
    return {"op_count": mt.op_count, "op_count_source": mt.op_count_source, "compile_time_s": mt.compile_time_s,
            "artifact_bytes": mt.artifact_bytes, "peak_rss_bytes": mt.peak_rss_bytes, "validation": validation,
            "bench": bench}


def _model_file(manifest) -> tuple[str, str]:
    """(file name, loader) of the loadable model in an artifact (:func:`neuron_build.artifact.artifact_file`).

    Raises:
        UserError: the artifact holds neither ``model.pt`` nor ``model.pt2``.
    """
    found = artifact_file(manifest.compiler, manifest.files)
    if found is None:
        raise UserError(f"artifact {manifest.key[:12]} ({manifest.target}) holds no model.pt or model.pt2; "
                        f"files: {', '.join(manifest.files)}")
    return found


def create_release(ws: Workspace, model: str, dtype: str | None = None, profile: str | None = None,
                   creator: str | None = None) -> Release:
    """Record an immutable release of all of ``model``'s buckets for one dtype and profile (and the
    workspace's backend), or return the existing record with the same content.

    Args:
        ws: the opened project (:class:`neuron_build.workspace.Workspace`; its backend decides which keys are
            released).
        dtype, profile: required when the model has several.
        creator: recorded as who made it; default :func:`actor`.

    Returns:
        The :class:`~neuron_build.release.records.Release` as the store holds it (``to_json()``: the
        record written with :meth:`~neuron_build.store.contract.ArtifactStore.put_release`, what
        ``release --json`` prints).

    Raises:
        UserError: unknown model, dtype or profile; or a bucket that is missing, failed, or built with a
            different toolchain than the others (every offending target is named).
    """
    choice = choose_targets(ws, model, dtype, profile)
    found = built_artifacts(ws, choice)
    draft, metrics = draft_release(ws, choice, found)
    return record_release(ws, draft, metrics, creator)


@dataclass(frozen=True)
class ReleaseChoice:
    """Step 1 of :func:`create_release` (:func:`choose_targets`): the model's spec, the dtype and profile
    chosen, its targets of them, and ``combo`` (``<model> <dtype>/<profile> (<backend>)`` for messages)."""

    model: str
    spec: Any
    dtype: str
    profile: str
    targets: list[Any]
    combo: str


def choose_targets(ws: Workspace, model: str, dtype: str | None, profile: str | None) -> ReleaseChoice:
    """Step 1: the dtype and profile of the release (required when the model has several) and its targets.

    Raises:
        UserError: unknown model, dtype or profile, or several to choose from and none chosen.
    """
    project: Project = ws.project
    require_model(project, model)
    spec = project.config.models[model]
    unchosen = [f"{flag} ({', '.join(allowed)})" for given, allowed, flag in
                ((dtype, spec.dtypes, "--dtype"), (profile, spec.profiles, "--profile"))
                if given is None and len(allowed) > 1]
    if unchosen:
        raise UserError(f"model '{model}' is built for several dtypes or profiles; choose with "
                        f"{' and '.join(unchosen)}")
    dtype = _pick("dtype", dtype, spec.dtypes, model, "--dtype")
    profile = _pick("profile", profile, spec.profiles, model, "--profile")
    targets = [t for t in ws.targets if t.model == model and t.dtype == dtype and t.profile == profile]
    return ReleaseChoice(model=model, spec=spec, dtype=dtype, profile=profile, targets=targets,
                         combo=f"{model} {dtype}/{profile} ({ws.keys.backend})")


def built_artifacts(ws: Workspace, choice: ReleaseChoice) -> list[tuple[Any, str, Any]]:
    """Step 2: ``(target, key, manifest)`` of every chosen bucket, all built with one toolchain (this
    checkout's when it covers them all).

    Raises:
        UserError: a bucket missing or failed, or built with a different toolchain than the others (every
            offending target named).
    """
    store: ArtifactStore = ws.store
    targets, combo = choice.targets, choice.combo
    problems: list[str] = []
    cands: dict[str, dict[str, str]] = {}
    for t in targets:
        c, problem = release_candidates(ws, t)
        if problem:
            problems.append(f"{t.id}: {problem}")
        else:
            cands[t.id] = c
    found: list[tuple[Any, str, Any]] = []
    if not problems:
        # one toolchain for every bucket: this checkout's when it covers them all
        common = set.intersection(*(set(c) for c in cands.values()))
        current = canonical_json(ws.key(targets[0]).details["toolchain"]).decode()
        if common:
            tc = current if current in common else min(common)
            found = [(t, cands[t.id][tc], store.manifest(cands[t.id][tc])) for t in targets]
        else:
            for t in targets:
                tcs = " or ".join(_toolchain_text(x) for x in cands[t.id])
                problems.append(f"{t.id}: built with a different toolchain than the others: {tcs}")
            problems.append("rebuild them with one toolchain (`neuron-build build` on one host)")
    if problems:
        bad = len(targets) - len(cands)
        head = (f"cannot release {combo}: {bad} of {len(targets)} bucket(s) missing or failed" if bad
                else f"cannot release {combo}: its buckets were built with different toolchains")
        raise UserError(head + "\n" + "\n".join(f"  {p}" for p in problems))
    return found


def draft_release(ws: Workspace, choice: ReleaseChoice, found: list[tuple[Any, str, Any]]
                  ) -> tuple[Release, dict[str, dict[str, Any]]]:
    """Step 3: the release without its id and record fields (its artifacts, toolchain and runtime: what
    the id hashes), and each artifact's metrics (:func:`artifact_summary`, by target id)."""
    store: ArtifactStore = ws.store
    spec, dtype = choice.spec, choice.dtype
    artifacts: list[ReleaseArtifact] = []
    metrics: dict[str, dict[str, Any]] = {}
    for t, key, m in found:
        name, loader = _model_file(m)
        artifacts.append(ReleaseArtifact(
            target=t.id, key=key, bucket=dict(t.bucket), bucket_id=t.bucket_id,
            inputs=[i.to_json() for i in t.inputs(spec)],
            files={n: {"sha256": f.sha256, "size": f.size} for n, f in sorted(m.files.items())},
            artifact=name, loader=loader))
        metrics[t.id] = artifact_summary(store, key, m)
    runtime = {
        "dims": list(spec.buckets),
        "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype or dtype, "pad": i.pad_value,
                    # integer ranges: what serving checks values against (a float range only shapes examples)
                    **({"range": list(i.range)} if i.dtype in INTEGER_DTYPES and i.range is not None else {})}
                   for i in spec.inputs],
        "truncate": spec.truncate, "convert_dtypes": spec.convert_dtypes}
    if spec.is_textgen:  # prefill and decode graphs: what generate() routes by
        runtime["inputs"] = [{"name": "input_ids", "shape": ["batch", "seq"], "dtype": "int64", "pad": 0}]
        runtime["textgen"] = {"max_seq_len": spec.max_seq_len,
                              "graphs": {t.bucket_id: t.graph for t, _, _ in found}}
    first = found[0][2]
    serving = (first.compiler or {}).get("serving")
    if serving is not None:  # compile-cache / torchneuron: the artifact is a cache; serving rebuilds the model
        runtime["serving"] = serving
    draft = Release(id="", format=RELEASE_FORMAT, model=choice.model, dtype=dtype, profile=choice.profile,
                    backend=first.backend, hardware_target=first.hardware_target, artifacts=tuple(artifacts),
                    toolchain=first.toolchain, runtime=runtime)
    return draft, metrics


def record_release(ws: Workspace, draft: Release, metrics: dict[str, dict[str, Any]], creator: str | None) -> Release:
    """Step 4: the release's id (:func:`release_id` of its content); the existing record of that id, or a
    new one (metrics, git state, time, creator) written to the store. Returns the release as stored."""
    store: ArtifactStore = ws.store
    model = draft.model
    rid = release_id(draft.content())
    existing = find_release(store, model, rid)
    if existing is not None:
        return existing
    commit, dirty = git_state(ws.project.root)
    times = [v["compile_time_s"] for v in metrics.values()]
    ops = [v["op_count"] for v in metrics.values() if v["op_count"] is not None]
    record = replace(draft, id=rid,
                     metrics={"op_count_total": sum(ops) if ops else None,
                              "compile_time_p95_s": percentile(times, 95, method="nearest-rank"),
                              "compile_time_max_s": max(times),
                              "artifact_bytes_total": sum(v["artifact_bytes"] for v in metrics.values()),
                              "artifacts": metrics},
                     git_commit=commit, git_dirty=dirty, created=utc_now(), creator=creator or actor())
    store.put_release(model, rid, record.to_json())
    return find_release(store, model, rid) or record


__all__ = ["build_advice", "ReleaseChoice", "artifact_summary", "create_release", "release_candidates", "require_model"]
