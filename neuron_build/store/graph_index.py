"""The graph index: graph key -> the action-cache key whose artifact was compiled from that graph.

The second level of the key (:mod:`neuron_build.compilers.graph_key`). One small object per graph key at
``graphs/<graph key[:2]>/<graph key>.json`` (:func:`neuron_build.store.layout.graph_path`), written through
the store's :class:`~neuron_build.store.contract.ObjectIO`, so every implementation holds it, a
read-through store writes it to its remote too, and ``push``/``fetch`` copy it (``graphs`` is one of the
shared areas). An entry is untrusted input: :func:`lookup` returns it only when it parses, names itself
and points at a well-formed key; the builder reuses the key only when the action cache holds it
complete. An entry whose artifact is gone (collected, quarantined) is replaced by the next compile.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import GRAPHS_DIR, graph_path, is_digest
from neuron_build.store.objects import parse_object

#: The version of an entry's JSON.
SCHEMA = 1


@dataclass(frozen=True)
class GraphEntry:
    """One graph index entry.

    Attributes:
        graph_key: the graph key (64 hex chars).
        key: the action-cache key holding the artifact compiled from the graph (64 hex chars).
        target: the target id that compiled it; backend: its backend; time: when (ISO 8601, UTC).
    """

    graph_key: str
    key: str
    target: str = ""
    backend: str = ""
    time: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, raw: Any, graph_key: str) -> GraphEntry | None:
        """The entry in ``raw`` if it is one for ``graph_key`` (both keys 64 hex chars), else None."""
        if not isinstance(raw, dict) or raw.get("graph_key") != graph_key:
            return None
        key = raw.get("key")
        if not isinstance(key, str) or not is_digest(key):
            return None
        return cls(graph_key=graph_key, key=key, **{k: str(raw.get(k) or "") for k in ("target", "backend", "time")})


def lookup(store: ObjectIO, graph_key: str) -> GraphEntry | None:
    """The index entry of ``graph_key``, or None (absent, unreadable, or not an entry of this graph key)."""
    if not is_digest(graph_key):
        return None
    raw = parse_object(store.get_object(graph_path(graph_key)))
    return None if raw is None else GraphEntry.from_json(raw, graph_key)


def record(store: ObjectIO, entry: GraphEntry, replace: bool = False) -> bool:
    """Add ``entry`` to the index. The first entry of a graph key is kept (create-only) unless ``replace``
    (its artifact is gone: the builder compiled it again).

    Returns:
        True when written, False when an entry was kept.

    Raises:
        ValueError: a key of ``entry`` is not 64 hex chars.
        OSError: the store could not be written.
    """
    if not (is_digest(entry.graph_key) and is_digest(entry.key)):
        raise ValueError(f"graph index entry {entry.graph_key[:16]} -> {entry.key[:16]}: keys must be 64 hex chars")
    data = (json.dumps(entry.to_json(), sort_keys=True) + "\n").encode()
    return store.put_object(graph_path(entry.graph_key), data, create_only=not replace)


def known(store: ObjectIO) -> list[str]:
    """Every graph key the index holds, sorted (from the object names alone: nothing is read)."""
    out = []
    for path in store.list_objects(GRAPHS_DIR):
        parts = path.split("/")
        if len(parts) == 3 and parts[2].endswith(".json") and is_digest(parts[2][:-5]) and parts[1] == parts[2][:2]:
            out.append(parts[2][:-5])
    return sorted(out)


def entries(store: ObjectIO) -> Iterable[GraphEntry]:
    """Every readable entry of the index, by graph key."""
    for gk in known(store):
        e = lookup(store, gk)
        if e is not None:
            yield e


def copy_entries(src: ObjectIO, dst: ObjectIO, keys: Iterable[str]) -> int:
    """Copy the entries of ``src`` that point at one of ``keys`` into ``dst`` where ``dst`` has no entry of
    that graph key (``push``/``fetch``). Returns how many were written."""
    wanted, n = set(keys), 0
    for e in entries(src):
        if e.key in wanted and lookup(dst, e.graph_key) is None and record(dst, e):
            n += 1
    return n


__all__ = ["SCHEMA", "GraphEntry", "copy_entries", "entries", "known", "lookup", "record"]
