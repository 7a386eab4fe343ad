"""``manifest.json``: what an artifact is, how it was built and what it measured.

Written last into the staging folder and committed last into the store's action cache
(``ac/<key[:2]>/<key>.json``), so an artifact whose manifest is missing or does not match its blobs is
incomplete by definition. ``files`` are the artifact (pinned by releases, stored as blobs); ``logs`` are
what the build printed (kept under ``logs/<key>/``, not byte-stable, never pinned). ``created`` and ``host`` are informational and never part of the key.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

MANIFEST_FORMAT = 1
#: File names (suffixes) of an artifact folder that are build logs, not artifact files: they are not
#: byte-stable (times, workdir paths), so they go to ``logs/<key>/`` and no release pins them.
LOG_SUFFIXES = (".log", "command.txt")


def is_log_name(name: str) -> bool:
    """Is ``name`` (a path inside an artifact folder) a build log: ``worker.log``, ``compile.log``,
    ``tp_<r>.compile.log``, ``command.txt``?"""
    return name.endswith(LOG_SUFFIXES)

class FileEntry(BaseModel):
    """One file of an artifact: its sha256 (64 hex chars) and size in bytes."""

    model_config = ConfigDict(extra="forbid")
    sha256: str
    size: int


class Metrics(BaseModel):
    """What a compile measured.

    ``compile_time_s``: wall time of the compile subprocess, seconds; for a relinked artifact (new weights
    with stored compiled files: ``relinked_from``) the compile time of the artifact it was relinked from, and
    ``relink_time_s`` (an extra field, present on relinked artifacts only) the seconds of the relink itself; a
    graph reuse (``reused_from``) likewise, with ``reuse_time_s``.
    ``op_count``: kernels the compiled
    artifact launches, counted as ``op_count_source`` says. ``artifact_bytes``: total bytes of the
    artifact's files. ``peak_rss_bytes``: peak resident memory of the compile's process tree, bytes.
    ``compiler_compile_time_s``: the compiler's own figure when its log reports one.
    """

    model_config = ConfigDict(extra="allow")
    status: str
    compile_time_s: float
    op_count: int | None = None
    op_count_source: str | None = None
    artifact_bytes: int = 0
    peak_rss_bytes: int | None = None
    exit_code: int | None = None
    attempts: int = 1
    compiler_compile_time_s: float | None = None
    reason: str | None = None


class Manifest(BaseModel):
    """The manifest of one artifact (one key)."""

    model_config = ConfigDict(extra="allow")
    format: int = MANIFEST_FORMAT
    key: str
    target: str
    model: str
    bucket: dict[str, int]
    dtype: str
    profile: str
    backend: str
    hardware_target: str
    key_details: dict[str, Any]
    component_hashes: dict[str, str]
    files: dict[str, FileEntry]
    #: the build's logs (``worker.log``, ``compile.log``, ...): stored under ``logs/<key>/``, never pinned
    logs: dict[str, FileEntry] = {}
    metrics: Metrics
    toolchain: dict[str, str | None]
    compiler: dict[str, Any] = {}
    created: str
    host: str
    #: the graph key (:mod:`neuron_build.compilers.graph_key`) of the graph the artifact was compiled from;
    #: None when the backend made none (or it was off)
    graph_key: str | None = None
    #: sha256 of the graph's canonical document (:func:`neuron_build.compilers.graph_key.document_digest`);
    #: a graph reuse of this artifact is published only when the new graph's document has this digest
    graph_document: str | None = None
    #: set when nothing was compiled for this key: the key whose artifact (same graph key) it shares blobs with
    reused_from: str | None = None
    #: the neuron-build version that wrote the manifest (informational, never in the key)
    neuron_build_version: str | None = None
    #: what the build recorded besides the declared inputs (``imports``, ``files``, ``env``, ``dists``, each
    #: name -> digest, value or version: :meth:`neuron_build.project.keys.KeyMaker.recorded_inputs`); a
    #: lookup is a hit only when all still match. None: nothing recorded
    recorded_inputs: dict[str, Any] | None = None


__all__ = ["LOG_SUFFIXES", "MANIFEST_FORMAT", "FileEntry", "Manifest", "Metrics", "is_log_name"]
