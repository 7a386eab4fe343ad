"""Edits of ``buckets.toml`` in place that keep its comments and layout (tomlkit), checked before written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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


__all__ = ["set_buckets"]
