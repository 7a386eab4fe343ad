"""Releases, channels, gates, promotion, rollback, history and pull.

Domain code: no doit, no torch. The package:

- :mod:`neuron_build.release.records`: the typed release record, channel pointer and history entry, and
  reading releases (:func:`load_release`, ...).
- :mod:`neuron_build.release.create`: making a release, one step a function (:func:`create_release`).
- :mod:`neuron_build.release.gates`: the nine promotion gates (:data:`~neuron_build.release.gates.GATES`,
  :func:`~neuron_build.release.gates.evaluate_gates`).
- :mod:`neuron_build.release.channels`: promotion (compare-and-swap), rollback, the channel table.
- :mod:`neuron_build.release.pull`: writing a channel's release into a folder, checksums verified.

Store layout (``docs/releases.md``)::

    <store>/releases/<model>/<release id>.json        immutable release records
    <store>/channels/<model>/<channel>.json           the channel pointer: {"release", "version", ...}, moved
                                                      by compare-and-swap (S3: If-Match on its ETag; a folder:
                                                      under locks/swap/, :mod:`neuron_build.store.medium`)
    <store>/channels/<model>/<channel>.history/<time>-<op>.json   one object per promotion, refusal and
                                                      rollback, written create-only
                                                      (:mod:`neuron_build.store.layout`)

This module re-exports the names callers import from the package.
"""

from __future__ import annotations

from neuron_build.release.channels import (
    SWAP_ATTEMPTS,
    PromotionRefused,
    channel_rows,
    check_channel,
    promote,
    rollback,
)
from neuron_build.release.create import create_release, require_model
from neuron_build.release.gates import format_gates
from neuron_build.release.pull import pull
from neuron_build.release.records import (
    ChannelPointer,
    HistoryEntry,
    Release,
    channel_history,
    channel_pointer,
    get_pointer,
    get_release,
    list_releases,
    load_release,
)

__all__ = [
    "SWAP_ATTEMPTS",
    "ChannelPointer",
    "HistoryEntry",
    "PromotionRefused",
    "Release",
    "channel_history",
    "channel_pointer",
    "channel_rows",
    "check_channel",
    "create_release",
    "format_gates",
    "get_pointer",
    "get_release",
    "list_releases",
    "load_release",
    "promote",
    "pull",
    "require_model",
    "rollback",
]
