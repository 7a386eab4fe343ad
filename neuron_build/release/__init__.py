"""Releases, channels, gates, promotion, rollback, history and pull.

Domain code: no doit, no torch. The package:

- :mod:`neuron_build.release.records`: the typed release record, channel pointer and history entry, and
  reading releases (:func:`load_release`, ...).
- :mod:`neuron_build.release.create`: making a release, one step a function (:func:`create_release`).
- :mod:`neuron_build.release.gates`: the nine promotion gates (:data:`GATES`, :func:`evaluate_gates`).
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

This module re-exports the names callers use.
"""

from __future__ import annotations

from neuron_build.release.channels import (
    SWAP_ATTEMPTS,
    PromotionRefused,
    channel_rows,
    check_channel,
    promote,
    release_stack,
    rollback,
)
from neuron_build.release.create import create_release, require_model
from neuron_build.release.gates import GATES, GateCheck, evaluate_gates, format_gates
from neuron_build.release.pull import pull
from neuron_build.release.records import (
    ID_FIELDS,
    RELEASE_FORMAT,
    ChannelPointer,
    HistoryEntry,
    Release,
    ReleaseArtifact,
    actor,
    channel_history,
    channel_pointer,
    find_release,
    get_history,
    get_pointer,
    get_release,
    git_state,
    list_releases,
    load_release,
    release_id,
)
from neuron_build.runtime.pulled import PULL_FORMAT, PulledRelease

__all__ = [
    "GATES",
    "ID_FIELDS",
    "SWAP_ATTEMPTS",
    "PULL_FORMAT",
    "RELEASE_FORMAT",
    "ChannelPointer",
    "GateCheck",
    "HistoryEntry",
    "PromotionRefused",
    "PulledRelease",
    "Release",
    "ReleaseArtifact",
    "actor",
    "channel_history",
    "channel_pointer",
    "channel_rows",
    "check_channel",
    "create_release",
    "evaluate_gates",
    "find_release",
    "format_gates",
    "get_history",
    "get_pointer",
    "get_release",
    "git_state",
    "list_releases",
    "load_release",
    "promote",
    "pull",
    "release_id",
    "release_stack",
    "require_model",
    "rollback",
]
