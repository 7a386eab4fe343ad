"""What one target's build carries from step to step (:class:`BuildContext`): shared by the
:class:`~neuron_build.build.builder.Builder`, the graph reuse (:mod:`neuron_build.build.graph_reuse`) and the
manifest (:mod:`neuron_build.build.manifests`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_build.project.keys import KeyInfo
from neuron_build.project.matrix import Target


@dataclass(frozen=True)
class BuildContext:
    """One target being built: the target, its key, the attempt's number (1 for the first compile, 0
    before any), the logger bound to the target, the key components changed since its last build, and
    (while a failed attempt is recorded) the attempt's work folder. ``stale``: why the artifact the store
    holds for the key is stale (recorded inputs that changed): this build's manifest replaces it."""

    target: Target
    ki: KeyInfo
    log: Any
    attempt: int = 0
    changed: tuple[str, ...] = field(default_factory=tuple)
    work: Path | None = None
    stale: tuple[str, ...] = field(default_factory=tuple)


__all__ = ["BuildContext"]
