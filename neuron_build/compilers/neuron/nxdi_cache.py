"""NxDI per-bucket reuse: a libneuronxla persistent compile cache that the store owns, and a stable work
directory.

NxD's ModelBuilder compiles each bucket with ``neuron_xla_compile(..., cache_key=get_hash_module(hlo, flags),
use_cache=True)``, where ``get_hash_module`` is ``sha256(str(hlo) + flags.replace(" ", ""))[:20]`` and the
flags already hold ``--logfile=<absolute bucket work dir>/log-neuron-cc.txt`` [code: NxD model_builder.py;
shared notes ``hlo-before-neff.md`` 1.2]. The cache is a folder ``neuronxcc-<compiler version>/MODULE_<key>+
<flags hash>/`` (``model.hlo_module.pb``, ``compile_flags.json``, ``model.neff``, ``model.done``) under
``NEURON_COMPILE_CACHE_URL`` [doc: neuron-caching.rst]. So:

- the work directory (``BASE_COMPILE_WORK_DIR``) is :func:`stable_workdir`: one absolute path per target id,
  the same on every build and every host, so the flags and the keys are the same; a file lock serialises two
  compiles of one target on one host (NxDI removes and refills the folder);
- before the compile the builder calls :func:`neuron_build.store.neuron_cache.restore`: the entries the target's last artifact carries (the
  pointer in the store's ``neuron-cache`` area, :mod:`neuron_build.store.neuron_cache`) are copied into
  ``<work>/neuron-cache`` with every file checked against the artifact's manifest (an entry with a bad file
  is left out whole: a miss, never a wrong NEFF), and ``NEURON_COMPILE_CACHE_URL`` points there;
- after the compile :func:`collect` tells per bucket whether its NEFF came from the cache or was compiled
  (by the NEFF's bytes: each bucket's ``graph.neff`` equals the ``model.neff`` of one entry) and copies the
  entries the compile used into the artifact (``neuron-cache/...``); the builder then points the target at
  the new artifact (:func:`neuron_build.store.neuron_cache.remember`).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from neuron_build.util import file_sha256

#: The artifact folder (and the worker's cache folder name) holding the cache entries.
CACHE_FILES = "neuron-cache"
#: The request option carrying the restored cache folder (absolute).
OPTION = "nxdi_cache"
#: Where the stable work directories live (absolute and the same on every host: the flags hold it).
STABLE_ROOT = Path("/tmp/neuron-build-nxd")
#: An entry exists when this file does (written last) [doc: neuron-caching.rst].
DONE = "model.done"


def is_nxdi(req: Any) -> bool:
    """Is ``req`` an NxDI compile (backend neuron, a text-generation target with a NeuronConfig)?"""
    return req.backend == "neuron" and "neuron_config" in (req.options or {})


def stable_workdir(target_id: str) -> Path:
    """The NxD work directory of ``target_id``: ``/tmp/neuron-build-nxd/<sha256(target id)[:16]>``."""
    return STABLE_ROOT / hashlib.sha256(target_id.encode()).hexdigest()[:16]


def entries(cache: Path) -> dict[str, str]:
    """The complete entries under ``cache``: ``neuronxcc-<v>/MODULE_...`` -> sha256 of its model.neff."""
    found = {}
    for done in sorted(cache.glob(f"neuronxcc-*/MODULE_*/{DONE}")):
        neff = done.parent / "model.neff"
        if neff.is_file():
            found[done.parent.relative_to(cache).as_posix()] = file_sha256(neff)
    return found


def collect(cache: Path, before: dict[str, str], work: Path, out: Path) -> dict[str, dict[str, Any]]:
    """Per bucket (``<submodel>/_tp0_bk<i>``), where its NEFF came from, and the entries used copied into
    ``out/neuron-cache/``.

    Args:
        cache: the cache folder the compile used; before: :func:`entries` of it before the compile.
        work: the NxD work directory (``<submodel>/_tp0_bk<i>/graph.neff`` per bucket).
        out: the artifact folder.

    Returns:
        ``{bucket: {"source": "cache" | "compiled" | "unknown", "entry": "neuronxcc-<v>/MODULE_..." | None}}``
        ("unknown": no ``graph.neff`` in the bucket's folder, or none of the cache entries holds it).
    """
    after = entries(cache)
    by_neff = {sha: e for e, sha in after.items()}
    result: dict[str, dict[str, Any]] = {}
    used = set()
    for neff in sorted(work.glob("*/_tp*_bk*/graph.neff")):
        bucket = neff.parent.relative_to(work).as_posix()
        entry = by_neff.get(file_sha256(neff))
        if entry is None:
            result[bucket] = {"source": "unknown", "entry": None}
            continue
        used.add(entry)
        result[bucket] = {"source": "cache" if before.get(entry) == after[entry] else "compiled", "entry": entry}
    for entry in sorted(used):
        src = cache.joinpath(*entry.split("/"))
        dst = out / CACHE_FILES / entry
        dst.mkdir(parents=True, exist_ok=True)
        for f in sorted(p for p in src.iterdir() if p.is_file() and not p.name.endswith((".lock", ".tmp"))):
            if f.name != DONE:
                shutil.copyfile(f, dst / f.name)
        shutil.copyfile(src / DONE, dst / DONE)
    return result


def environ_for(cache: Path) -> dict[str, str]:
    """The environment of an NxDI compile that uses ``cache``: ``NEURON_COMPILE_CACHE_URL`` [doc]."""
    return {"NEURON_COMPILE_CACHE_URL": str(cache)}


__all__ = ["CACHE_FILES", "DONE", "OPTION", "STABLE_ROOT", "collect", "entries", "environ_for", "is_nxdi",
           "stable_workdir"]
