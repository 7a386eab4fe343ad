"""Counting the hashes of file contents a build makes in this process: every path by which neuron-build
hashes a file (``file_sha256`` where the builder and the store call it, a folder medium's ``hash`` and
``get_files``) is wrapped, and each digest computed is recorded."""

from __future__ import annotations

import pytest

from neuron_build import util
from neuron_build.build import manifests
from neuron_build.store import core
from neuron_build.store.medium import FolderMedium


def hash_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Start recording; returns the list the digests of every file hashed from now on are appended to."""
    seen: list[str] = []
    real_file, real_hash, real_get = util.file_sha256, FolderMedium.hash, FolderMedium.get_files

    def file_sha256(path, *a, **kw):
        seen.append(real_file(path, *a, **kw))
        return seen[-1]

    def medium_hash(self, rel):
        got = real_hash(self, rel)
        if got is not None:
            seen.append(got)
        return got

    def get_files(self, pairs):
        got = real_get(self, pairs)
        seen.extend(got)
        return got

    for module in (util, manifests, core):
        monkeypatch.setattr(module, "file_sha256", file_sha256)
    monkeypatch.setattr(FolderMedium, "hash", medium_hash)
    monkeypatch.setattr(FolderMedium, "get_files", get_files)
    return seen
