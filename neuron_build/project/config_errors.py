"""The error renderer of ``buckets.toml``: pydantic's validation errors as one line per fault.

Each line names the TOML path (``models.minilm.buckets.seq[2]``), what is wrong and what is allowed; an
unknown key gets a "did you mean" hint from the fields of the table it sits in. The models themselves are
in :mod:`neuron_build.project.config`, the checks across tables and against the file system in
:mod:`neuron_build.project.config_checks`.
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

#: pydantic error types of a value of the wrong kind -> what the value must be.
_WANT = {"int": "a whole number", "bool": "true or false", "string": "a string", "float": "a number",
         "list": "a list", "tuple": "a list", "dict": "a table", "model": "a table"}
_TYPE_ERRORS = ("int_type", "int_parsing", "bool_type", "bool_parsing", "string_type", "float_type",
                "float_parsing", "list_type", "tuple_type", "dict_type", "model_type")


def toml_path(loc: tuple[Any, ...]) -> str:
    """Format a pydantic error location as a TOML path: ``("models", "m", "buckets", "seq", 2)`` ->
    ``models.m.buckets.seq[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            s = str(part)
            s = s if re.match(r"^[A-Za-z0-9_-]+$", s) else f'"{s}"'
            out += ("." if out else "") + s
    return out or "(top level)"


def _optional_inner(tp: Any) -> Any:
    """``X`` of ``X | None`` (the first non-None member of a union)."""
    return [a for a in typing.get_args(tp) if a is not type(None)][0]


def fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names allowed in the table at ``loc`` under ``model`` (for "did you mean"); empty when
    ``loc`` is not a table."""
    tp: Any = model
    parts = list(loc)
    while parts:
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            name = parts.pop(0)
            if name not in tp.model_fields:
                return []
            tp = tp.model_fields[name].annotation
        elif origin in (dict,):
            parts.pop(0)
            tp = typing.get_args(tp)[1]
        elif origin in (tuple, list):
            parts.pop(0)
            tp = typing.get_args(tp)[0]
        elif origin is typing.Union:
            tp = _optional_inner(tp)
        else:
            return []
    while typing.get_origin(tp) is typing.Union:
        tp = _optional_inner(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def describe(err: dict[str, Any], model: type[BaseModel]) -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) of a document validated as ``model``
    as one line: the TOML path, what is wrong, what is allowed."""
    loc = tuple(p for p in err["loc"] if p != "[key]")
    typ, msg = err["type"], err["msg"]
    if typ == "extra_forbidden":
        key = str(loc[-1])
        allowed = fields_at(model, loc[:-1])
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"{toml_path(loc)}: unknown key '{key}'; {hint}allowed keys: {', '.join(allowed)}"
    if typ == "missing":
        return f"{toml_path(loc)}: required key is missing; add it"
    if typ == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        allowed = re.findall(r"'([^']*)'", expected)
        got = str(err.get("input"))
        close = difflib.get_close_matches(got, allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"{toml_path(loc)}: {got!r} is not allowed; allowed: {', '.join(allowed)}{hint}"
    if typ == "too_short":
        n = err.get("ctx", {}).get("min_length", 1)
        return f"{toml_path(loc)}: is empty; give at least {n} item{'s' if n != 1 else ''}"
    if typ in _TYPE_ERRORS:
        return f"{toml_path(loc)}: {err.get('input')!r} is not allowed; it must be {_WANT[typ.split('_')[0]]}"
    if typ in ("greater_than", "greater_than_equal"):
        return f"{toml_path(loc)}: {err.get('input')!r} is not allowed; it must be {msg.removeprefix('Input should be ')}"
    if typ == "value_error":
        return f"{toml_path(loc)}: {msg.removeprefix('Value error, ')}"
    return f"{toml_path(loc)}: {msg} (got {err.get('input')!r})"


def _typos(errors: list[dict[str, Any]], model: type[BaseModel]) -> set[tuple[Any, ...]]:
    """Locations of missing keys that an unknown key beside them is a typo of (``dtype`` for ``dtypes``)."""
    out = set()
    for e in errors:
        if e["type"] == "extra_forbidden":
            parent = tuple(e["loc"][:-1])
            close = difflib.get_close_matches(str(e["loc"][-1]), fields_at(model, parent), n=1)
            if close:
                out.add(parent + (close[0],))
    return out


def validation_faults(exc: ValidationError, model: type[BaseModel]) -> list[str]:
    """The faults of ``exc`` (raised validating a document as ``model``), one line each, each once.

    An unknown key whose "did you mean" is a missing required key is one fault (a typo), not two; a list
    left short because one of its items failed is the item's fault only.
    """
    errors = exc.errors(include_url=False)
    locs = [tuple(e["loc"]) for e in errors]
    typo_of = _typos(errors, model)
    faults: list[str] = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in typo_of:
            continue
        if e["type"] == "too_short" and any(len(o) > len(loc) and o[:len(loc)] == loc for o in locs):
            continue
        line = describe(e, model)
        if line not in faults:
            faults.append(line)
    return faults


__all__ = ["describe", "fields_at", "toml_path", "validation_faults"]
