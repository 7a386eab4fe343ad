"""The words ``buckets.toml``'s models (:mod:`neuron_build.project.config`) and its static checks
(:mod:`neuron_build.project.config_checks`) share. Plain constants, no pydantic: the checks import these,
not the models, so the config modules import one another without a cycle."""

from __future__ import annotations

import re

from neuron_build.backends import TEXTGEN_BACKENDS

DEFAULT_CONFIG = "buckets.toml"
TEXT_GENERATION = "text-generation"
#: The auto class a text-generation hf model loads with (the default for ``task = "text-generation"``).
CAUSAL_LM = "AutoModelForCausalLM"
#: The backends that build text-generation models: :data:`neuron_build.backends.TEXTGEN_BACKENDS` (re-exported).
#: A profile, model or channel name: safe in paths and target ids.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: What :data:`NAME` allows, in words (said after "name 'x'" in a fault).
NAME_RULE = "may hold only ASCII letters, digits, '_', '.', '-' and must start with a letter or digit"
#: The longest model, profile or channel name, in characters: each becomes part of a file name in the store
#: (a file name is at most 255 bytes on Linux and macOS; a target id joins four names in one).
MAX_NAME_CHARS = 64


def long_name_fault(kind: str, name: str) -> str | None:
    """The fault of a ``kind`` name (``"model"``, ``"channel"``) longer than :data:`MAX_NAME_CHARS`, or None."""
    if len(name) <= MAX_NAME_CHARS:
        return None
    return (f"{kind} name {name[:20]!r}... is {len(name)} characters; at most {MAX_NAME_CHARS} (it becomes a file "
            f"name in the store)")


__all__ = ["CAUSAL_LM", "DEFAULT_CONFIG", "MAX_NAME_CHARS", "NAME", "NAME_RULE", "TEXTGEN_BACKENDS", "TEXT_GENERATION",
           "long_name_fault"]
