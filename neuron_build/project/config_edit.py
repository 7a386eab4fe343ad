"""Edits of ``buckets.toml`` in place that keep its comments and layout (tomlkit), checked before written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_build.errors import UserError


def set_buckets(config: str | Path, model: str, buckets: Mapping[str, Sequence[int]]) -> str:
    """Replace the sizes of some bucket dims of ``[models.MODEL]`` in the file ``config`` and return the new
    text, not written. Every other byte stays: comments, key order, inline or sub-table layout, the other
    dims; only the arrays of the given dims are rewritten (one line each).

    Args:
        config: the ``buckets.toml`` path.
        model: the model name.
        buckets: dim -> ascending sizes (positive ints); each dim must already be a bucket dim of the model.

    Raises:
        UserError: the file does not parse, has no such model, or the model no such bucket dim.
    """
    import tomlkit

    p = Path(config)
    try:
        doc = tomlkit.parse(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.ParseError) as e:
        raise UserError(f"{p}: cannot edit it ({e})") from None
    models = doc.get("models")
    if models is None or model not in models:
        raise UserError(f"{p}: no [models.{model}] table to edit")
    table = models[model]
    have = table.get("buckets")
    for dim, sizes in buckets.items():
        if have is None or dim not in have:
            raise UserError(f"{p}: [models.{model}] has no bucket dim '{dim}' (buckets = "
                            f"{dict(have) if have is not None else {}}); add it by hand first")
        arr = tomlkit.array()
        arr.extend(int(n) for n in sizes)
        old = have[dim]
        trivia = getattr(old, "trivia", None)
        if trivia is not None:  # keep a comment after the array (`seq = [32, 64]  # tokens`)
            arr.trivia.comment_ws, arr.trivia.comment = trivia.comment_ws, trivia.comment
        have[dim] = arr
    return tomlkit.dumps(doc)


def _fmt_buckets(b: Mapping[str, Sequence[int]]) -> str:
    return " ".join(f"{d}={list(v)}" for d, v in b.items())


def _pct(r: float | None) -> str:
    return "-" if r is None else f"{100 * r:.2f} %"


def refusal(doc: Mapping) -> tuple[str, list[str]] | None:
    """Why ``--write`` refuses a :func:`~neuron_build.project.bucket_search.suggestion` document ``doc``
    (it serves less than the current buckets: ``narrower_than_current``, or pads more:
    ``worse_than_current``) and the fixes that would lift the refusal, each one true (``doc``'s
    ``remedies``; ``--force`` is the caller's to add); None when ``--write`` would write."""
    sug = doc["suggested"]
    narrower = doc.get("narrower_than_current") or {}
    if narrower:
        lost = "; ".join(f"{d} up to {v['suggested']} (today up to {v['current']}: requests of {v['suggested'] + 1} "
                         f"to {v['current']} would be refused)" for d, v in narrower.items())
        return (f"the suggested buckets {_fmt_buckets(sug['buckets'])} serve {lost}",
                ["drop --narrow to keep today's largest bucket"])
    if not doc["worse_than_current"]:
        return None
    cur, rem, fixes = doc["current"], doc.get("remedies") or {}, []
    if rem.get("max_buckets"):
        fixes.append(f"allow {rem['max_buckets']} NEFFs (--max-buckets {rem['max_buckets']})")
    if rem.get("not_multiple"):
        nm = rem["not_multiple"]
        fixes.append(f"drop --multiple (today's {nm['size']} is no multiple of {nm['multiple']})")
    if not fixes:
        fixes.append("keep today's buckets (no search within these limits pads less)")
    return (f"the suggested buckets {_fmt_buckets(sug['buckets'])} pad {_pct(sug['padding_ratio'])}, more than the "
            f"current {_fmt_buckets(cur['buckets'])} ({_pct(cur['padding_ratio'])})", fixes)


def check_suggestion(config: str | Path, doc: Mapping, force: bool = False) -> None:
    """Refuse to write a :func:`~neuron_build.project.bucket_search.suggestion` document ``doc`` into
    ``config`` that serves less than the current buckets or pads more (:func:`refusal`), unless ``force``.

    Raises:
        UserError: one line naming the file, what the suggestion would lose and the fixes that work.
    """
    why = None if force else refusal(doc)
    if why:
        raise UserError(f"{config}: not written: {why[0]}; {', '.join(why[1])}, or add --force to write them anyway")


def write_buckets(project: Any, model: str, buckets: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """Write ``buckets`` (dim -> sizes) of ``[models.MODEL]`` into the project's ``buckets.toml`` in place
    (:func:`set_buckets`: comments and layout kept), checked first: a config that would not load is never
    written, and the file is replaced atomically.

    Args:
        project: the loaded :class:`~neuron_build.project.config.Project` (its path and config before the edit).
        model: the model name.
        buckets: the new sizes of some of its bucket dims.

    Returns:
        ``file`` (path), ``changed`` (False when the file already holds these sizes: nothing written),
        ``added``, ``kept``, ``removed`` (the model's target ids the edit adds, keeps, drops from the
        matrix), and when changed ``buckets`` (the new sizes) and ``was`` (the old sizes of those dims).

    Raises:
        UserError: the edited config would not load (naming ``project``'s file and why).
    """
    from neuron_build.project.config import load_project
    from neuron_build.project.matrix import expand
    from neuron_build.util import temp_name, write_atomic

    new = {d: list(v) for d, v in buckets.items()}
    old_targets = [t.id for t in expand(project) if t.model == model]
    unchanged = all(sorted(project.config.models[model].buckets[d]) == v for d, v in new.items())
    if unchanged:
        return {"file": str(project.path), "changed": False, "added": [], "kept": old_targets, "removed": []}
    text = set_buckets(project.path, model, new)
    tmp = temp_name(project.path)
    try:
        tmp.write_text(text, encoding="utf-8")
        checked = load_project(tmp)
    except UserError as e:  # name the user's file, not the temporary copy it was checked in
        why = str(e).replace(str(tmp), str(project.path))
        raise UserError(f"{project.path}: not written: the suggested buckets {new} would not load ({why})") from None
    finally:
        tmp.unlink(missing_ok=True)
    write_atomic(project.path, text.encode("utf-8"))
    new_targets = [t.id for t in expand(checked) if t.model == model]
    was = {d: list(project.config.models[model].buckets[d]) for d in new}
    return {"file": str(project.path), "changed": True, "buckets": new, "was": was,
            "added": [t for t in new_targets if t not in old_targets],
            "kept": [t for t in new_targets if t in old_targets],
            "removed": [t for t in old_targets if t not in new_targets]}


def apply_suggestion(project: Any, model: str, doc: Mapping, force: bool = False) -> dict[str, Any]:
    """Apply a bucket suggestion (``buckets suggest --write``): :func:`check_suggestion`, then
    :func:`write_buckets` of its ``suggested`` buckets. Returns what :func:`write_buckets` returns.

    Raises:
        UserError: the suggestion serves less or pads more than today's buckets (without ``force``), or the
            edited config would not load.
    """
    check_suggestion(project.path, doc, force)
    return write_buckets(project, model, doc["suggested"]["buckets"])


__all__ = ["refusal", "apply_suggestion", "check_suggestion", "set_buckets", "write_buckets"]
