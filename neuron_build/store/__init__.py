"""The store layer: the contract (:mod:`.contract`), the local folder implementation (:mod:`.local`),
manifests, records, locks, and upkeep (verify, gc). The only package that knows a store's layout."""

from __future__ import annotations

from pathlib import Path

from neuron_build.store.contract import ArtifactStore, Lookup
from neuron_build.store.local import LocalStore


def open_store(location: str | Path, read_only: bool | None = None) -> ArtifactStore:
    """The store at ``location`` (a folder path; the project's ``[build] store``).

    Args:
        read_only: open it read-only; None: read-only when the folder exists and this process may not
            write it (a read-only mount, ``chmod -R a-w``), so reads never try to move anything.

    Raises:
        UserError: the folder has the old layout (see :class:`LocalStore`).
    """
    import os

    if read_only is None:
        read_only = os.path.isdir(location) and not os.access(location, os.W_OK)
    return LocalStore(location, read_only=read_only)


__all__ = ["ArtifactStore", "Lookup", "LocalStore", "open_store"]
