"""The NxDI persistent-cache area: per compiler version and target, the artifact holding the cache entries.

NxDI compiles every bucket through libneuronxla's persistent compile cache (``MODULE_<key>+<flags>/`` folders
under ``neuronxcc-<version>/`` [doc: neuron-caching.rst]). neuron-build owns that cache: the entries a
compile used travel inside its artifact (files under ``neuron-cache/``, blobs of the CAS like every other
file, so they are verified by digest, pushed, fetched and collected with the artifact), and this area holds
one small pointer per (compiler version, target): ``neuron-cache/neuronxcc-<version>/<target id>.json`` =
``{"schema", "target", "compiler_version", "key"}``. The next compile of the target restores the entries
of the artifact the pointer names (:mod:`neuron_build.compilers.neuron.nxdi_cache`).

A pointer is untrusted input: :func:`lookup` returns its key only when it parses, names its own target and
compiler version and holds a well-formed key; a pointer whose artifact is gone is a miss (the next compile
writes a new one).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import NEURON_CACHE_DIR, is_digest, neuron_cache_path
from neuron_build.store.objects import parse_object
from neuron_build.trust import target_id_problem
from neuron_build.util import file_sha256

#: The version of a pointer's JSON.
SCHEMA = 1


def _valid_version(version: str) -> bool:
    return bool(version) and "/" not in version and ".." not in version and len(version) <= 100


def lookup(store: ObjectIO, compiler_version: str, target_id: str) -> str | None:
    """The action-cache key the pointer of (``compiler_version``, ``target_id``) names, or None."""
    if not _valid_version(compiler_version) or target_id_problem(target_id) is not None:
        return None
    raw = parse_object(store.get_object(neuron_cache_path(compiler_version, target_id)))
    if not isinstance(raw, dict) or raw.get("target") != target_id or raw.get("compiler_version") != compiler_version:
        return None
    key = raw.get("key")
    return key if isinstance(key, str) and is_digest(key) else None


def record(store: ObjectIO, compiler_version: str, target_id: str, key: str) -> bool:
    """Point (``compiler_version``, ``target_id``) at ``key`` (replacing the previous pointer).

    Raises:
        ValueError: a malformed key, version or target id.
        OSError: the store could not be written.
    """
    if not is_digest(key) or not _valid_version(compiler_version) or target_id_problem(target_id) is not None:
        raise ValueError(f"NxDI cache pointer {compiler_version!r} {target_id!r} -> {key[:16]!r}: malformed")
    data = (json.dumps({"schema": SCHEMA, "target": target_id, "compiler_version": compiler_version, "key": key},
                       sort_keys=True) + "\n").encode()
    return store.put_object(neuron_cache_path(compiler_version, target_id), data)


#: The folder of an artifact holding its cache entries: ``neuron-cache/neuronxcc-<v>/MODULE_<key>+<flags>/<file>``
#: (the same name as the area; :data:`neuron_build.compilers.neuron.nxdi_cache.CACHE_FILES`).
ARTIFACT_FOLDER = NEURON_CACHE_DIR
#: An entry exists when this file does; restored last [doc: neuron-caching.rst].
DONE = "model.done"


def _safe_rel(name: str) -> list[str] | None:
    parts = name.split("/")
    if not parts or any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    return parts


def restore(store: Any, target_id: str, compiler_version: str | None, dest: Path) -> dict[str, Any]:
    """Copy the cache entries of ``target_id``'s artifact for ``compiler_version`` (the pointer's) into
    ``dest`` (libneuronxla's folder layout), each file checked against the artifact's manifest; an entry with
    a missing or mismatching file is left out whole (a miss, never a wrong NEFF).

    Returns:
        ``{"from": key or None, "entries": n restored, "dropped": n left out}``. Never raises for what the
        store holds: anything unreadable is a miss.

    Raises:
        OSError: ``dest`` cannot be written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"from": None, "entries": 0, "dropped": 0}
    if not compiler_version:
        return out
    key = lookup(store, compiler_version, target_id)
    man = store.manifest(key) if key else None
    if man is None:
        return out
    try:
        src = store.artifact_dir(key)
    except OSError:
        return out
    out["from"] = key
    entries: dict[str, list[tuple[list[str], str, str]]] = {}
    for name, f in man.files.items():
        parts = _safe_rel(name)
        if parts is None or parts[0] != ARTIFACT_FOLDER or len(parts) != 4 or not parts[1].startswith("neuronxcc-"):
            continue
        entries.setdefault("/".join(parts[1:3]), []).append((parts[1:], name, f.sha256))
    for entry, files in sorted(entries.items()):
        ok = True
        for rel, name, sha in sorted(files, key=lambda x: x[0][-1] == DONE):  # model.done last
            d = dest.joinpath(*rel)
            d.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(src / name, d)
            except OSError:
                ok = False
                break
            if file_sha256(d) != sha:
                ok = False
                break
        if ok:
            out["entries"] += 1
        else:
            shutil.rmtree(dest.joinpath(*entry.split("/")), ignore_errors=True)
            out["dropped"] += 1
    return out


def remember(store: ObjectIO, target_id: str, compiler_version: str | None, key: str, files: Iterable[str]) -> bool:
    """Point the target's cache at ``key`` when its artifact carries cache entries (``files``: its file
    names). Returns True when written.

    Raises:
        ValueError, OSError: as :func:`record`.
    """
    if not compiler_version or not any(str(n).startswith(ARTIFACT_FOLDER + "/") for n in files):
        return False
    return record(store, compiler_version, target_id, key)


def pointers(store: ObjectIO) -> Iterable[tuple[str, str, str]]:
    """Every readable pointer: (compiler version, target id, key)."""
    for path in store.list_objects(NEURON_CACHE_DIR):
        parts = path.split("/")
        if len(parts) < 3 or not parts[1].startswith("neuronxcc-") or not path.endswith(".json"):
            continue
        version, target_id = parts[1][len("neuronxcc-"):], "/".join(parts[2:])[:-5]
        key = lookup(store, version, target_id)
        if key is not None:
            yield version, target_id, key


def copy_pointers(src: ObjectIO, dst: ObjectIO, keys: Iterable[str]) -> int:
    """Copy the pointers of ``src`` that name one of ``keys`` into ``dst`` where ``dst`` has none for that
    version and target (``push``/``fetch``). Returns how many were written."""
    wanted, n = set(keys), 0
    for version, target_id, key in pointers(src):
        if key in wanted and lookup(dst, version, target_id) is None and record(dst, version, target_id, key):
            n += 1
    return n


__all__ = ["ARTIFACT_FOLDER", "DONE", "SCHEMA", "copy_pointers", "lookup", "pointers", "record", "remember",
           "restore"]
