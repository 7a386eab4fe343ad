"""The store layer: the contract (:mod:`.contract`), the shared layout (:mod:`.layout`), the local folder
implementation (:mod:`.local`), the fsspec remote (:mod:`.remote`), the read-through pair
(:mod:`.tiered`), copies between stores (:mod:`.sync`), manifests, records, locks, and upkeep (verify,
gc). The only package that knows a store's layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_build.store.contract import ArtifactStore, Lookup
from neuron_build.store.local import LocalStore


def is_url(location: str | Path) -> bool:
    """Does ``location`` name a remote store (a URL with a scheme other than ``file://``)?"""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def open_store(location: str | Path, options: dict[str, Any] | None = None,
               read_only: bool | None = None) -> ArtifactStore:
    """The store at ``location``: a folder path (or ``file://`` URL) opens a
    :class:`~neuron_build.store.local.LocalStore`; any other URL (``s3://bucket/prefix``, ``memory://x``)
    a :class:`~neuron_build.store.remote.RemoteStore` with fsspec storage ``options``.

    Args:
        read_only: open a folder read-only; None: read-only when the folder exists and this process may
            not write it (a read-only mount, ``chmod -R a-w``), so reads never try to move anything.

    Raises:
        UserError: the folder has the old layout (see :class:`LocalStore`).
    """
    if is_url(location):
        from neuron_build.store.remote import RemoteStore
        return RemoteStore(str(location), options or {})
    import os

    folder = str(location).removeprefix("file://")
    if read_only is None:
        read_only = os.path.isdir(folder) and not os.access(folder, os.W_OK)
    return LocalStore(folder, read_only=read_only)


def cached_store(location: str | Path, remote: str | None, options: dict[str, Any] | None = None) -> ArtifactStore:
    """The store a project builds into (``Project.store_url()``): a local store read through to the
    ``remote`` URL when one is set (a :class:`~neuron_build.store.tiered.ReadThroughStore`), else the store
    at ``location`` alone. ``options``: ``[build] remote_options``."""
    store = open_store(location, options)
    if remote is None or not isinstance(store, LocalStore):
        return store
    from neuron_build.store.tiered import ReadThroughStore
    return ReadThroughStore(store, open_store(remote, options))


__all__ = ["ArtifactStore", "Lookup", "LocalStore", "is_url", "cached_store", "open_store"]
