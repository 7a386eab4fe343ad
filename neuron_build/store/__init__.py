"""The store layer: the contract (:mod:`.contract`), the shared layout (:mod:`.layout`), the local folder
implementation (:mod:`.local`), the fsspec/S3 implementation (:mod:`.remote`, imported only for a URL), the
read-through pair (:mod:`.tiered`), copies between stores (:mod:`.sync`), manifests, records, locks, and
upkeep (verify, gc). The only package that knows a store's layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_build.store.contract import ArtifactStore, Lookup
from neuron_build.store.local import LocalStore


def open_store(location: str | Path, read_only: bool | None = None,
               options: dict[str, Any] | None = None) -> ArtifactStore:
    """The store at ``location``: a URL with a scheme (``s3://bucket/prefix``, ``memory://name``,
    ``file:///path``, any fsspec URL) is a :class:`~neuron_build.store.remote.RemoteStore`; a path is a
    :class:`LocalStore`.

    Args:
        read_only: open it read-only; None: for a folder, read-only when it exists and this process may
            not write it (a read-only mount, ``chmod -R a-w``), so reads never try to move anything; for a
            URL, False (a write the credentials deny raises :class:`~neuron_build.errors.StoreDenied`,
            reads go on).
        options: fsspec storage options of a URL (``[build] remote_options``); ignored for a folder.

    Raises:
        UserError: the folder has the old layout (see :class:`LocalStore`), or the URL needs a package
            that is not installed (``s3://``: the ``s3`` extra).
    """
    import os

    if is_url(location):
        from neuron_build.store.remote import RemoteStore
        return RemoteStore(str(location), options, read_only=bool(read_only))
    if read_only is None:
        read_only = os.path.isdir(location) and not os.access(location, os.W_OK)
    return LocalStore(location, read_only=read_only)


def is_url(location: str | Path) -> bool:
    """Does ``location`` name a store by URL (``s3://``, ``memory://``, ``file://``, ...)?"""
    return isinstance(location, str) and "://" in location


def cached_store(location: str | Path, remote: str | None, options: dict[str, Any] | None = None) -> ArtifactStore:
    """The store a project builds into (``Project.store_url()``): a local store read through to the
    ``remote`` URL when one is set (a :class:`~neuron_build.store.tiered.ReadThroughStore`), else the store
    at ``location`` alone. ``options``: ``[build] remote_options``.

    Raises:
        StoreNotOpened: the remote's filesystem could not connect (the message names ``[build] remote``).
    """
    store = open_store(location, options=options)
    if remote is None or store.folder is None:
        return store
    from neuron_build.errors import StoreNotOpened
    from neuron_build.store.tiered import ReadThroughStore
    try:
        shared = open_store(remote, options=options)
    except StoreNotOpened as e:
        raise e.labelled("[build] remote") from e
    return ReadThroughStore(store, shared)


__all__ = ["ArtifactStore", "Lookup", "LocalStore", "cached_store", "is_url", "open_store"]
