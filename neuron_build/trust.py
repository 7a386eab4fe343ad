"""The trust boundary: names read from a store are checked before any of them becomes a path.

Anyone who can write to a shared bucket can write records into it, so a manifest, a release record, a
channel pointer or a listing is untrusted input. Before a name taken from one reaches the filesystem
(a pull folder, a view of the local store, a load), it must be:

- a **name** (a bucket id, a release id, a model, a channel, one part of a target id): a non-empty
  string without ``/`` or ``\\``, not ``.`` or ``..``, without NUL or control characters;
- a **relative path** (a file name of an artifact, which may sit in a sub-folder such as ``neff/x.neff``):
  POSIX parts that are each a name as above (so no leading ``/``, no ``..``, no empty part);
- a **digest** (a key, a blob's sha256): 64 lowercase hex chars.

A record that fails is refused with :class:`UntrustedRecord` (exit 1: a check failed), one line naming the
record, the store and the offending value. Lookups report such a manifest as damage (a miss, never served).
Writers never create symlinks, and :func:`inside` refuses a path that leaves its folder through one.

Core: no torch, no pydantic (the no-op build imports this); the store, release and runtime layers use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from neuron_build.errors import NeuronBuildError

_HEX = frozenset("0123456789abcdef")


def is_digest(name: str) -> bool:
    """Is ``name`` a key or a blob digest (64 lowercase hex chars)?"""
    return len(name) == 64 and set(name) <= _HEX


class UntrustedRecord(NeuronBuildError):
    """A record read from a store names a path outside where it may write (exit 1: a check failed).

    The message is one line: the record, the store, the value and why it is refused.
    """


def name_problem(value: Any) -> str | None:
    """Why ``value`` is not a single path component (a bucket id, release id, model, channel), or None."""
    if not isinstance(value, str) or not value:
        return "is empty or not a string"
    if "/" in value or "\\" in value:
        return "holds a path separator"
    if value in (".", ".."):
        return "is a relative folder reference"
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        return "holds a control character"
    return None


def relpath_problem(value: Any) -> str | None:
    """Why ``value`` is not a relative POSIX path inside its folder (an artifact's file name), or None."""
    if not isinstance(value, str) or not value:
        return "is empty or not a string"
    if value.startswith("/") or (len(value) > 1 and value[1] == ":"):
        return "is an absolute path"
    if "\\" in value:
        return "holds a backslash"
    for part in value.split("/"):
        if part in ("", ".", ".."):
            return "leaves its folder (an empty, '.' or '..' part)"
        if any(ord(c) < 32 or c == "\x7f" for c in part):
            return "holds a control character"
    return None


def target_id_problem(value: Any) -> str | None:
    """Why ``value`` is not a target id (``model/bucket/dtype/profile``: names joined by ``/``), or None."""
    if not isinstance(value, str) or not value:
        return "is empty or not a string"
    for part in value.split("/"):
        why = name_problem(part)
        if why is not None:
            return f"has a part that {why}"
    return None


def _files_problem(files: Any, field: str) -> str | None:
    if not isinstance(files, Mapping):
        return f"{field} is not a table"
    for name, ent in files.items():
        why = relpath_problem(name)
        if why is not None:
            return f"{field} name {name!r} {why}"
        if not isinstance(ent, Mapping) or not is_digest(str(ent.get("sha256", ""))):
            return f"{field} entry {name!r} has no sha256 of 64 hex chars"
    return None


def manifest_problem(raw: Mapping[str, Any]) -> str | None:
    """Why a parsed manifest names paths it may not (file and log names, its target and model), or None."""
    for field in ("files", "logs"):
        if field in raw:
            why = _files_problem(raw[field], field)
            if why is not None:
                return why
    for field, check in (("target", target_id_problem), ("model", name_problem)):
        if field in raw:
            why = check(raw[field])
            if why is not None:
                return f"{field} {raw[field]!r} {why}"
    return None


def release_problem(raw: Mapping[str, Any]) -> str | None:
    """Why a release record (as JSON, or as written into ``release.json`` by a pull) names paths it may
    not: its id, model, each bucket's id, target, key, file names and model file. None when it is clean."""
    for field in ("id", "release", "model"):
        if field in raw and raw[field] is not None:
            why = name_problem(raw[field])
            if why is not None:
                return f"{field} {raw[field]!r} {why}"
    arts = raw.get("artifacts", raw.get("buckets"))
    if not isinstance(arts, list):
        return None
    for a in arts:
        if not isinstance(a, Mapping):
            return "an artifact entry is not a table"
        bid = a.get("bucket_id", a.get("id"))
        why = name_problem(bid)
        if why is not None:
            return f"bucket id {bid!r} {why}"
        if "target" in a and (why := target_id_problem(a["target"])) is not None:
            return f"target {a['target']!r} {why}"
        if "key" in a and not is_digest(str(a["key"])):
            return f"key {str(a['key'])[:70]!r} is not 64 hex chars"
        why = _files_problem(a.get("files"), "file")
        if why is not None:
            return why
        art = a.get("artifact")
        if art and (why := relpath_problem(art)) is not None:
            return f"model file {art!r} {why}"
    return None


def check_release(raw: Mapping[str, Any], what: str, location: str) -> None:
    """Raise :class:`UntrustedRecord` unless :func:`release_problem` finds nothing in ``raw``.

    Args:
        what: the record, e.g. ``release r-1a2b of minilm``; location: the store (or folder) it came from.
    """
    why = release_problem(raw)
    if why is not None:
        raise UntrustedRecord(refusal(what, location, why))


def check_name(value: Any, field: str, what: str, location: str) -> str:
    """``value`` when it is a name (:func:`name_problem`), else raise :class:`UntrustedRecord`."""
    why = name_problem(value)
    if why is not None:
        raise UntrustedRecord(refusal(what, location, f"{field} {value!r} {why}"))
    return value


def refusal(what: str, location: str, why: str) -> str:
    """The one-line refusal of record ``what`` from store ``location``."""
    return (f"{what} in {location} is refused: {why}; a name in a store record must be a relative path "
            f"inside its folder (the record was written by something other than neuron-build, or tampered with)")


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` after checking it stays under ``root``: ``rel`` is a relative path (:func:`relpath_problem`)
    and no existing folder on the way is a symlink (so nothing written there lands elsewhere).

    Raises:
        ValueError: ``rel`` fails the check, or a part of the way is a symlink.
    """
    why = relpath_problem(rel)
    if why is not None:
        raise ValueError(f"{rel!r} {why}")
    p = root
    for part in rel.split("/"):
        p = p / part
        if os.path.islink(p):
            raise ValueError(f"{rel!r} passes through a symlink ({p})")
    return p


def files_problem(names: Iterable[str]) -> str | None:
    """Why one of ``names`` (artifact file names) is not a relative path inside its folder, or None."""
    for n in names:
        why = relpath_problem(n)
        if why is not None:
            return f"file name {n!r} {why}"
    return None



def check_files(files: Any, key: str, location: str) -> Any:
    """``files`` (a manifest's file table) when every name is a relative path inside the artifact folder
    and every entry has a sha256, else raise :class:`UntrustedRecord` naming the manifest of ``key``."""
    why = _files_problem(files, "file")
    if why is not None:
        raise UntrustedRecord(refusal(f"manifest of key {key[:12]}", location, why))
    return files


__all__ = ["UntrustedRecord", "check_files", "check_name", "check_release", "files_problem", "inside", "manifest_problem",
           "name_problem", "refusal", "release_problem", "relpath_problem", "target_id_problem"]
