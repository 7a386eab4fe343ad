"""The digest cache: sha256 of large files, re-read only when their stat signature changes.

A leaf of the project layer with no pydantic, torch or config import: the no-op build's check of recorded
reads (:class:`neuron_build.project.reads.InputCheck`) uses it without planning."""

from __future__ import annotations

import json
from pathlib import Path

from neuron_build.util import file_sha256, write_atomic


class DigestCache:
    """sha256 digests of large files, cached by (path, size, mtime_ns, ctime_ns, inode) in a JSON file.

    A no-op build stats each weight file instead of reading it. An in-place rewrite that restores size and
    mtime still changes ctime (the kernel sets it on every write and on ``utime``), and a replacement file
    has another inode, so either is noticed. The cache file lives in the project's state folder; a missing
    or corrupt cache file is treated as empty. Writes are atomic (temp file + rename).
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._data: dict[str, list] = {}
        self._dirty = False
        if path is not None:
            try:
                self._data = json.loads(path.read_text())
            except (OSError, ValueError):
                self._data = {}

    def digest(self, file: Path) -> str:
        """The sha256 (64 hex chars) of ``file``'s content, read only when its stat signature changed.

        Raises:
            OSError: the file cannot be read.
        """
        st = file.stat()
        sig = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        ent = self._data.get(str(file))
        if ent and ent[:4] == sig:
            return ent[4]
        d = file_sha256(file)
        self._data[str(file)] = [*sig, d]
        self._dirty = True
        return d

    def save(self) -> None:
        if not self._dirty or self.path is None:
            return
        write_atomic(self.path, json.dumps(self._data).encode())
        self._dirty = False


__all__ = ["DigestCache"]
