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
from collections.abc import Iterable

from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import NEURON_CACHE_DIR, is_digest, neuron_cache_path
from neuron_build.store.objects import parse_object
from neuron_build.trust import target_id_problem

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


__all__ = ["SCHEMA", "copy_pointers", "lookup", "pointers", "record"]
