"""Relink instead of compile: a target whose graph *structure* is stored, with other weight values.

A profile with ``weights = "external"`` keys its graph by structure (:mod:`neuron_build.compilers.weights`);
its worker writes the weights file (``weights.safetensors``) and the spec (``weights.json``) into the
staging folder before it asks the graph index. An NxDI target (whose NEFFs never hold weights) stages the
new checkpoint sharded (``weights/tp{rank}_sharded_checkpoint.safetensors``, named by its spec) once the
index holds its structure (:mod:`neuron_build.compilers.neuron.nxdi_weights`). When the index holds the structure, nothing is compiled:
:func:`relink` publishes the stored artifact's compiled files (linked, verified by digest as any publish
does) plus the new weights file, the manifest records ``relinked_from`` (and ``explain`` and ``show`` say
``relinked from <key>``). Its metrics keep the ``compile_time_s`` of the artifact it was relinked from (the
compile that made its compiled files: the release's compile-time gate bounds what a cold build of the release
costs, which a 2 s relink of a 2 h compile does not change) and record this run's seconds as
``relink_time_s``. The weights file is content-addressed like
every file: buckets of one model with the same weights share one blob.

Fails closed (None: the caller compiles): the stored artifact's compiler did not record
``weights = "external"`` (it inlined its weights: an older artifact, or a package that did not list every
weight), the staged weights do not fit the stored spec (names, dtypes, shapes, read from the headers), or the
staged folder lacks a weights file the stored spec names.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from neuron_build.build.attempt import disk_full
from neuron_build.build.executor import WORKER_LOG
from neuron_build.build.manifests import artifact_manifest, hash_files
from neuron_build.compilers import weights
from neuron_build.status import Status

#: The outcome reason of a relink (``explain`` prints the same words from the manifest).
RELINKED = "weights changed, graph unchanged: relinked from {source}"


def carried_metrics(old: Any) -> dict[str, Any]:
    """The metrics of ``old`` (a manifest) that a relink or reuse of it keeps: all but the seconds of the
    relink or reuse that made ``old`` (``relink_time_s``, ``reuse_time_s``), which are not this one's."""
    return {k: v for k, v in old.metrics.model_dump().items() if k not in ("relink_time_s", "reuse_time_s")}


def staged(obj: Path) -> bool:
    """Does the worker's staging folder hold external weights (a relink, not a plain reuse)?"""
    return (Path(obj) / weights.WEIGHTS_FILE).is_file() or (Path(obj) / weights.SPEC_FILE).is_file()


def weights_files(store: Any, source: str, old: Any) -> list[str]:
    """The weights files of the artifact of ``source`` (manifest ``old``): those its spec names.

    Raises:
        ValueError: the spec cannot be read, or names a file the manifest does not list.
    """
    specs = weights.read_specs(store.artifact_dir(source)) if weights.SPEC_FILE in old.files else None
    if not specs or any(name not in old.files for name in specs):
        raise ValueError("the stored artifact has no weights spec naming its weights files")
    return sorted(specs)


def refused(store: Any, source: str, old: Any, obj: Path) -> str | None:
    """Why the artifact of ``source`` (manifest ``old``) cannot take the weights staged in ``obj``, or None."""
    if (old.compiler or {}).get("weights") != "external":
        return "the stored artifact holds its weights inline"
    try:
        weights_files(store, source, old)
    except ValueError as e:
        return str(e)
    return weights.problem(store.artifact_dir(source), root=obj)


def relink(graph: Any, ctx: Any, req: Any, hit: Any, obj: Path, source: str, old: Any,  # noqa: PLR0913
           recorded_inputs: dict[str, Any]) -> tuple[str, dict[str, Any], bool] | None:
    """Publish ``ctx``'s key as ``source``'s compiled files plus the weights staged in ``obj``.

    Args:
        graph: the :class:`~neuron_build.build.graph.reuse.GraphReuse` (store, provenance).
        hit: the :class:`~neuron_build.build.graph.reuse.GraphHit` (its log, seconds, peak memory and exit
            status are recorded).
        source, old: the stored artifact of the same structure and its manifest (already checked by
            :func:`~neuron_build.build.graph.reuse.reuse_refused`).

    Returns:
        (graph key, the new manifest's metrics, whether the weights differ from ``source``'s: False for an
        edit that changed neither graph nor weights, recorded as ``reused_from``, not ``relinked_from``), or
        None (logged) when the relink is refused: compile.

    Raises:
        DiskFull: the file system filled up; nothing was published.
    """
    store, gk = graph.store, str(old.graph_key)
    why = refused(store, source, old, obj)
    if why is not None:
        ctx.log.warning("cannot relink the weights; compiling", graph_key=gk[:12], candidate=source[:12], reason=why)
        return None
    view, new = store.artifact_dir(source), set(weights_files(store, source, old))
    with disk_full("writing the artifact", obj):
        for name in old.files:
            if name in new:
                continue  # the new weights, staged by the worker
            dest = Path(obj) / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)  # the worker's spec: the stored one is what the weights were checked by
            try:
                os.link(view / name, dest)
            except OSError:
                shutil.copyfile(view / name, dest)
        (Path(obj) / WORKER_LOG).write_bytes(hit.log)
    files, logs = hash_files(obj)
    if set(files) != set(old.files):
        ctx.log.warning("cannot relink the weights; compiling", graph_key=gk[:12], candidate=source[:12],
                        reason=f"the staged files are {sorted(files)}, the stored ones {sorted(old.files)}")
        return None
    # compile_time_s stays the compile's (of the artifact relinked from, carried along a chain of relinks):
    # what the release's compile-time gate and `show` mean by it; this run's seconds are the relink's
    # (identical weight bytes: recorded as a reuse, with the reuse's seconds)
    new_weights = any(files[n]["sha256"] != old.files[n].sha256 for n in new)
    metrics = {**carried_metrics(old), "status": Status.PASS, ("relink_time_s" if new_weights else "reuse_time_s"):
               round(hit.seconds, 3), "peak_rss_bytes": hit.peak_rss_bytes, "exit_code": hit.exit_code,
               "attempts": ctx.attempt, "reason": None, "artifact_bytes": sum(e["size"] for e in files.values())}
    origin = ({"relinked_from": source} if new_weights
              else {"reused_from": source if source != ctx.ki.key else old.reused_from})
    manifest = artifact_manifest(
        ctx, req, files, logs, metrics, toolchain=dict(old.toolchain), compiler=dict(old.compiler), graph_key=gk,
        graph_document=old.graph_document, recorded_inputs=recorded_inputs, **origin, **graph.provenance)
    with disk_full("writing the manifest", obj):
        store.seal(obj, manifest)
    with disk_full("publishing", obj):
        store.publish(obj, ctx.ki.key, replace=bool(ctx.stale))
    return gk, metrics, new_weights


__all__ = ["RELINKED", "carried_metrics", "refused", "relink", "staged", "weights_files"]
