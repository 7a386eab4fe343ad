"""The recorded reads of a model: what builds of its factory read besides imports (files opened,
environment variables, distributions imported; :mod:`neuron_build.project.reads`), kept at
``targets/<model>/reads.json`` (:func:`neuron_build.store.layout.reads_path`) through the store's
:class:`~neuron_build.store.contract.ObjectIO`, beside the recorded imports, and keyed by the next plan.
A record that does not parse is treated as empty (untrusted input: the key maker never reads a path
outside the project from it)."""

from __future__ import annotations

import json
from typing import Any

from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import reads_path

#: The kinds of a record (as :data:`neuron_build.project.reads.KINDS`; the store does not import the project).
KINDS = ("files", "env", "dists")


def empty() -> dict[str, list[str]]:
    return {k: [] for k in KINDS}


def merge(*records: Any) -> dict[str, list[str]]:
    """The union of reads records (unknown kinds and non-string entries dropped), each list sorted."""
    out: dict[str, set[str]] = {k: set() for k in KINDS}
    for rec in records:
        if isinstance(rec, dict):
            for k in KINDS:
                vals = rec.get(k)
                if isinstance(vals, list):
                    out[k].update(v for v in vals if isinstance(v, str) and v)
    return {k: sorted(v) for k, v in out.items()}


def recorded_reads(store: ObjectIO, model: str) -> dict[str, list[str]]:
    """The reads recorded for ``model`` (``{"files", "env", "dists"}``, each sorted; empty when none)."""
    data = store.get_object(reads_path(model))
    if data is None:
        return empty()
    try:
        return merge(json.loads(data))
    except ValueError:
        return empty()


def add_recorded_reads(store: ObjectIO, model: str, reads: dict[str, list[str]]) -> dict[str, list[str]]:
    """Add ``reads`` to the record of ``model`` (a union: nothing recorded is dropped) and return the union;
    nothing is written when it holds them already.

    Raises:
        OSError: the store could not be written.
    """
    have = recorded_reads(store, model)
    union = merge(have, reads)
    if union != have:
        store.put_object(reads_path(model), (json.dumps({"schema": 1, **union}, sort_keys=True) + "\n").encode())
    return union


__all__ = ["add_recorded_reads", "recorded_reads"]
