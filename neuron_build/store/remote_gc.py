"""``gc --remote``: the one collector (:mod:`neuron_build.store.gc`) on a shared store. Kept for the name
:func:`collect_remote_garbage`; the roots, the plan and the apply step are those of every store."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from neuron_build.store.gc import GcReport, collect_garbage


def collect_remote_garbage(store: Any, keep_keys: Iterable[str] = (), keep_days: float = 7.0,
                           dry_run: bool = False, current_targets: Iterable[str] | None = ()) -> GcReport:
    """:func:`~neuron_build.store.gc.collect_garbage` of a remote store. ``current_targets`` defaults to
    none: a shared bucket serves many checkouts, so other checkouts' target records keep nothing alive
    there (their entries stay until they age out); the caller's current keys are ``keep_keys``."""
    return collect_garbage(store, keep_keys=keep_keys, keep_days=keep_days, dry_run=dry_run,
                           current_targets=current_targets)


__all__ = ["collect_remote_garbage"]
