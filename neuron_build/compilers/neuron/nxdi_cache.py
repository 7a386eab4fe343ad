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
- before the compile the builder calls :func:`restore`: the entries the target's last artifact carries (the
  pointer in the store's ``neuron-cache`` area, :mod:`neuron_build.store.neuron_cache`) are copied into
  ``<work>/neuron-cache`` with every file checked against the artifact's manifest (an entry with a bad file
  is left out whole: a miss, never a wrong NEFF), and ``NEURON_COMPILE_CACHE_URL`` points there;
- after the compile :func:`collect` tells per bucket whether its NEFF came from the cache or was compiled
  (by the NEFF's bytes: each bucket's ``graph.neff`` equals the ``model.neff`` of one entry) and copies the
  entries the compile used into the artifact (``neuron-cache/...``); the builder then points the target at
  the new artifact (:func:`remember`).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

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


def _safe_rel(name: str) -> list[str] | None:
    parts = name.split("/")
    if not parts or any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    return parts


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def restore(store: Any, target_id: str, compiler_version: str | None, dest: Path) -> dict[str, Any]:
    """Copy the cache entries of ``target_id``'s last artifact for ``compiler_version`` into ``dest``.

    Returns:
        ``{"from": key or None, "entries": n restored, "dropped": n left out (a file missing or not matching
        its digest)}``. Never raises for what the store holds: anything unreadable is a miss.
    """
    from neuron_build.store import neuron_cache

    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"from": None, "entries": 0, "dropped": 0}
    if not compiler_version:
        return out
    key = neuron_cache.lookup(store, compiler_version, target_id)
    man = store.manifest(key) if key else None
    if man is None:
        return out
    try:
        src = store.artifact_dir(key)
    except (OSError, FileNotFoundError):
        return out
    out["from"] = key
    entries: dict[str, list[tuple[list[str], str, str]]] = {}
    for name, f in man.files.items():
        parts = _safe_rel(name)
        if parts is None or parts[0] != CACHE_FILES or len(parts) != 4 or not parts[1].startswith("neuronxcc-"):
            continue
        entries.setdefault("/".join(parts[1:3]), []).append((parts[1:], name, f.sha256))
    for entry, files in sorted(entries.items()):
        target = dest.joinpath(*entry.split("/"))
        ok = True
        for rel, name, sha in sorted(files, key=lambda x: x[0][-1] == DONE):  # model.done last
            d = dest.joinpath(*rel)
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(src / name, d)
            except OSError:
                ok = False
                break
            if _sha256(d) != sha:
                ok = False
                break
        if ok:
            out["entries"] += 1
        else:
            shutil.rmtree(target, ignore_errors=True)
            out["dropped"] += 1
    return out


def entries(cache: Path) -> dict[str, str]:
    """The complete entries under ``cache``: ``neuronxcc-<v>/MODULE_...`` -> sha256 of its model.neff."""
    found = {}
    for done in sorted(cache.glob(f"neuronxcc-*/MODULE_*/{DONE}")):
        neff = done.parent / "model.neff"
        if neff.is_file():
            found[done.parent.relative_to(cache).as_posix()] = _sha256(neff)
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
        entry = by_neff.get(_sha256(neff))
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


def remember(store: Any, target_id: str, compiler_version: str | None, key: str, files: Any) -> bool:
    """Point the target's cache at ``key`` when its artifact carries cache entries. Returns True when written."""
    from neuron_build.store import neuron_cache

    if not compiler_version or not any(str(n).startswith(CACHE_FILES + "/") for n in files):
        return False
    return neuron_cache.record(store, compiler_version, target_id, key)


def environ_for(cache: Path) -> dict[str, str]:
    """The environment of an NxDI compile that uses ``cache``: ``NEURON_COMPILE_CACHE_URL`` [doc]."""
    return {"NEURON_COMPILE_CACHE_URL": str(cache)}


__all__ = ["CACHE_FILES", "DONE", "OPTION", "STABLE_ROOT", "collect", "entries", "environ_for", "is_nxdi",
           "remember", "restore", "stable_workdir"]
