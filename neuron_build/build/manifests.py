"""The one place a build's ``manifest.json`` is made (:func:`artifact_manifest`), for a compiled artifact
and for a graph reuse alike, and the one place a staged artifact's files are hashed (:func:`hash_files`).

Each file is hashed once on its way into the store: the digests :func:`hash_files` computes are the ones
the manifest records, and :meth:`~neuron_build.store.core.Store.publish` stores the sealed folder's files
under them without hashing them again (it checks their sizes).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from neuron_build import __version__
from neuron_build.build.attempt import BuildContext
from neuron_build.compilers.base import CompileRequest
from neuron_build.store.manifest import Manifest, Metrics, is_log_name
from neuron_build.util import file_sha256, utc_now

#: name (a path inside the artifact folder) -> {"sha256": 64 hex chars, "size": bytes}
Entries = dict[str, dict[str, Any]]


def hash_files(folder: Path) -> tuple[Entries, Entries]:
    """(files, logs) of a staged artifact ``folder``: every regular file under it (the manifest aside, which
    is not there yet) with its sha256 and size, split by :func:`~neuron_build.store.manifest.is_log_name`.
    Each file is read once."""
    files: Entries = {}
    logs: Entries = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = f.relative_to(folder).as_posix()
        (logs if is_log_name(name) else files)[name] = {"sha256": file_sha256(f), "size": f.stat().st_size}
    return files, logs


def artifact_manifest(ctx: BuildContext, req: CompileRequest, files: Entries, logs: Entries, metrics: dict[str, Any],
                      **fields: Any) -> Manifest:
    """The manifest of ``ctx``'s key for the compile request ``req``: the target's identity and key, the
    artifact's ``files`` and ``logs`` (as :func:`hash_files` lists them), the compile's ``metrics``, this
    host and neuron-build version, and ``fields``: the other :class:`~neuron_build.store.manifest.Manifest`
    fields (``toolchain``, ``compiler``, ``graph_key``, ``graph_document``, ``reused_from``,
    ``recorded_inputs`` and the builder's provenance).

    Raises:
        pydantic.ValidationError: a field of the wrong type (a bug of the caller).
    """
    t = ctx.target
    return Manifest(
        key=ctx.ki.key, target=t.id, model=t.model, bucket=dict(t.bucket), dtype=t.dtype, profile=t.profile,
        backend=req.backend, hardware_target=req.hardware_target, key_details=ctx.ki.details,
        component_hashes=ctx.ki.hashes, files=files, logs=logs, metrics=Metrics(**metrics), created=utc_now(),
        host=socket.gethostname(), neuron_build_version=__version__, **fields)


__all__ = ["Entries", "artifact_manifest", "hash_files"]
