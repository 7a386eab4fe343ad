"""The store layer: the contract (:mod:`.contract`), the local folder implementation (:mod:`.local`),
manifests, records, locks, and upkeep (verify, gc). The only package that knows a store's layout."""

from __future__ import annotations

from pathlib import Path

from neuron_build.store.contract import ArtifactStore, Lookup
from neuron_build.store.local import LocalStore


def open_store(location: str | Path) -> ArtifactStore:
    """The store at ``location`` (a folder path; the project's ``[build] store``)."""
    return LocalStore(location)


__all__ = ["ArtifactStore", "Lookup", "LocalStore", "open_store"]
