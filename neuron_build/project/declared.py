"""What a model declares besides its factory, for what no recorder sees, and the escape hatch
(``[models.NAME]`` options, :class:`~neuron_build.project.config_models.ModelSpec`):

- ``inputs_from``: globs (``~`` expanded, absolute or relative to the folder of ``buckets.toml``, ``**``
  recursing) of files whose content is part of the key's ``model`` component, each pattern with the files
  it matches (name -> sha256, :func:`inputs_from_entries`); a pattern that matches nothing is keyed as
  empty, the pattern itself in the key, so a first match changes it;
- ``env``: environment variables whose values (None when unset) are part of the key's ``env`` component
  for that model (:func:`declared_env`);
- ``always_rebuild``: the target is never served from the cache: its records are marked incomplete
  (:data:`ALWAYS_REBUILD`), so every build compiles it (or reuses the compiled artifact of the same graph,
  captured again).

And the words of a rebuild whose record is incomplete (:func:`reasons`: one line each, with the fix), and
the read-time check of a worker's record (:func:`changed_since_read`: a file whose content at publish is
not what the worker read). No torch, no pydantic here: the no-op path may import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ALWAYS_REBUILD", "CHANGED_WHILE", "INCOMPLETE", "MISSING_FILE", "READ_STAT_BYTES", "changed_since_read",
           "declared_env", "fix", "glob_anchor", "inputs_from_entries", "reasons", "stat_digest"]

#: The ``incomplete`` reason a build of an ``always_rebuild`` model records (never a cache hit).
ALWAYS_REBUILD = "always_rebuild = true"
#: How :meth:`~neuron_build.project.reads.InputCheck.stale` words an incomplete record.
INCOMPLETE = "its build's reads were not fully recorded"
#: The ``incomplete`` reason of a file changed between the worker's read and the publish.
CHANGED_WHILE = "changed while the target compiled"
_GLOB_CHARS = frozenset("*?[")
#: Files larger than this (bytes) are reported by the worker by their stat signature, not read again.
READ_STAT_BYTES = 64 * 2**20
MISSING_FILE = "missing"


def glob_anchor(root: Path, pattern: str) -> tuple[Path, str]:
    """(the folder a pattern is matched under, the pattern relative to it): ``~`` expanded; an absolute
    pattern under ``/``, a relative one under ``root``."""
    expanded = os.path.expanduser(pattern)
    if os.path.isabs(expanded):
        anchor = Path(expanded).anchor
        return Path(anchor), expanded[len(anchor):]
    return root, expanded


def _base(anchor: Path, rel: str) -> Path:
    """The pattern's fixed folder: ``anchor`` joined with its parts before the first wildcard."""
    parts = Path(rel).parts
    fixed = []
    for part in parts[:-1]:
        if _GLOB_CHARS & set(part):
            break
        fixed.append(part)
    return anchor.joinpath(*fixed)


def inputs_from_entries(root: Path, patterns: tuple[str, ...] | list[str], digest: Any,
                        observe: Any = None) -> dict[str, dict[str, str]]:
    """The key entry of ``inputs_from``: pattern (as written) -> {name: sha256 (``digest(path)``)} of
    each file it matches, sorted. A file under ``root`` is named by its path relative to ``root``; one
    outside by its path relative to the pattern's fixed folder (``~/.cache/x/*.bin`` -> ``a.bin``), so the
    key holds no absolute path. ``observe`` (an :class:`~neuron_build.project.plan_cache.InputLog`) notes
    the glob (re-run on every plan-cache check) and each file before it is read."""
    root = root.resolve()
    out: dict[str, dict[str, str]] = {}
    for pattern in patterns:
        anchor, rel = glob_anchor(root, pattern)
        try:
            matches = sorted(p for p in anchor.glob(rel) if p.is_file())
        except (OSError, ValueError, NotImplementedError):
            matches = []
        if observe is not None:
            observe.glob(anchor, [rel], matches)
        base = _base(anchor, rel)
        entries: dict[str, str] = {}
        for f in matches:
            try:
                name = f.resolve().relative_to(root).as_posix()
            except (ValueError, OSError):
                name = f.relative_to(base).as_posix() if f.is_relative_to(base) else f.name
            if observe is not None:
                observe.file(f)
            entries[name] = digest(f)
        out[pattern] = entries
    return out


def declared_env(names: tuple[str, ...] | list[str], environ: Any) -> dict[str, str | None]:
    """The declared variables with their values (None when unset), sorted by name."""
    return {n: environ.get(n) for n in sorted(names)}


def fix(model: str) -> str:
    """The fix of a record that could not be complete, for model ``model``."""
    return (f"declare the input with inputs_from = [...] or env = [...] in [models.{model}], "
            f"or set always_rebuild = true")


def reasons(model: str, stale: list[str], always_rebuild: bool = False) -> list[str]:
    """Why the artifact of a target of ``model`` is not a hit, one line each (``stale``: the lines of
    :meth:`~neuron_build.project.reads.InputCheck.stale`): an incomplete record's line gets its fix (a
    file that changed while the target compiled needs none: the next build records it again); an
    ``always_rebuild`` model says so instead."""
    if always_rebuild:
        return [f"{ALWAYS_REBUILD} in [models.{model}]: never served from the cache"]
    return [f"{line}; {fix(model)}" if line.startswith(INCOMPLETE) and CHANGED_WHILE not in line
            and "always_rebuild" not in line else line for line in stale]


def stat_digest(path: Path | str) -> str:
    """``stat:<size>:<mtime_ns>:<ctime_ns>:<inode>`` of a file: what the worker reports for a file over
    :data:`READ_STAT_BYTES` instead of its sha256 (the digest cache trusts the same signature)."""
    st = os.stat(path)
    return f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def changed_since_read(files: dict[str, Any], digests: Any, root: Path | None = None) -> list[str]:
    """The recorded files (``files``: a ``recorded_inputs``' ``files``, name -> sha256 now) whose content
    is not what the worker read (``digests``: its record's name -> sha256 when read, or
    :func:`stat_digest` for a large file, compared with the file under ``root`` now). None (a worker that
    took no digests) checks nothing; a file the worker did not digest counts as changed (fail closed)."""
    if digests is None:
        return []
    if not isinstance(digests, dict):
        return sorted(files)
    out = []
    for f, now in files.items():
        then = digests.get(f)
        if isinstance(then, str) and then.startswith("stat:") and root is not None:
            from neuron_build.project.read_check import record_path
            path = record_path(root, f)
            try:
                now = stat_digest(path) if path is not None else MISSING_FILE
            except OSError:
                now = MISSING_FILE
        if then != now:
            out.append(f)
    return sorted(out)
