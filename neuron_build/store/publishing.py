"""Publishing a sealed staging folder into a :class:`~neuron_build.store.core.Store` (the mixin
:class:`Publishing`): every blob create-only, the build's logs, then the manifest create-only (the commit
point), then the blobs checked once more and any a collector removed meanwhile put back. Also "publish key B
over key A's blobs" (:meth:`Publishing.publish_as`, a graph reuse).

Each artifact file is hashed once on its way in: its sealer digests it for the manifest
(:func:`neuron_build.build.manifests.hash_files`), publishing stores it under that digest after a size check;
a blob already present is verified by digest before it is kept (a deterministic rebuild heals it).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.store import layout
from neuron_build.store.digests import SELF_DIGEST, manifest_digest
from neuron_build.store.layout import MANIFEST
from neuron_build.util import fsync_path, write_atomic

if TYPE_CHECKING:
    from neuron_build.store.manifest import Manifest

#: Rounds of "check my blobs again after the commit, put back what is gone" of one publish.
HEAL_ROUNDS = 3


class Publishing:
    """The publishing half of :class:`~neuron_build.store.core.Store` (which supplies ``medium``, the
    lookups, :meth:`quarantine`, the views and the object writes these methods use)."""

    medium: Any
    location: str
    cache: Any

    def _store_blob(self, sha256: str, src: Path, deep: bool = True) -> bool:
        """:meth:`put_blob` of a file whose digest its caller computed (not hashed again). An existing blob
        is checked by size, and with ``deep`` by digest, before it is kept; one a concurrent writer put while
        this upload was under way (:meth:`Medium.lost_race`) by size only (fresh: not touched)."""
        rel = layout.blob_path(sha256)
        if self.medium.put_file(rel, src, create_only=True):
            return True
        if self.medium.lost_race(rel):  # put just now by a concurrent writer: kept by its size, not read back
            why = self.blob_damage(sha256, src.stat().st_size)
            if why is None:
                return False
        else:
            why = self.blob_damage(sha256, src.stat().st_size, deep=deep)
        if why is None:
            if self.medium.touch(rel, src):
                return False
            return self.medium.put_file(rel, src, create_only=True)  # collected between the two calls
        self._quarantine_object(rel, sha256, f"{why}; replaced by a new copy")
        self.medium.put_file(rel, src, create_only=False)
        return True

    def seal(self, folder: Path, manifest: Manifest) -> dict[str, Any]:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            fsync_path(f)
        raw = manifest.model_dump(mode="json")
        raw[SELF_DIGEST] = manifest_digest(raw)
        write_atomic(folder / MANIFEST, (json.dumps(raw, indent=2) + "\n").encode())
        fsync_path(folder)
        return raw

    def publish(self, folder: Path, key: str, replace: bool = False) -> Path:
        """Store a sealed folder's files as blobs, its logs under ``logs/<key>/``, then its manifest
        (create-only, the commit point); then check the blobs once more and put back any a collector
        removed meanwhile. A complete artifact already there is kept (the folder is discarded) unless
        ``replace`` (it is stale: the new manifest replaces it); a damaged manifest in the way is
        quarantined first. Each file is stored under the digest the sealed manifest records (its sealer
        hashed it: :func:`neuron_build.build.manifests.hash_files`) after a check of its size; it is not
        hashed again. A blob already present is kept only when its bytes hash to its name.

        Returns:
            :meth:`artifact_dir` of ``key``.

        Raises:
            OSError or StoreError: e.g. ENOSPC, a wire fault, a read-only store; the key is not committed.
            ValueError: the folder has no manifest of ``key``, or a file is missing or of another size.
        """
        self._writable()
        self._commit(Path(folder), key, self._sealed(Path(folder), key), replace, deep=True)
        return self.artifact_dir(key)

    def publish_as(self, folder: Path, key: str, source: str, replace: bool = False) -> Path:
        """Publish key B over key A's blobs: the sealed manifest of ``key`` in ``folder`` (listing exactly
        the files of ``source``'s complete artifact; the folder holds only its logs) becomes the artifact of
        ``key`` as :meth:`publish` makes it, no artifact file copied. Each blob is verified once (its bytes
        hash to its name) and its age refreshed. Returns :meth:`artifact_dir` of ``key``.

        Raises:
            ValueError: no manifest of ``key`` in ``folder``; ``source`` is not complete here or has other
                files; one of its blobs is damaged. Nothing is published: the caller compiles.
            OSError or StoreError: as :meth:`publish`.
        """
        self._writable()
        folder = Path(folder)
        text = self._sealed(folder, key)
        files = json.loads(text).get("files") or {}
        found = self.lookup(source)
        if not found.hit or files != {n: e.model_dump() for n, e in found.manifest.files.items()}:
            raise ValueError(f"key {source[:16]} holds no complete artifact with the files of the manifest of "
                             f"{key[:16]} in {self.location}; not published")
        for name, ent in files.items():
            why = self.blob_damage(ent["sha256"], ent["size"], deep=True)
            if why is not None:
                raise ValueError(f"{name} of key {source[:16]}: {why}; not published")
        view = self.artifact_dir(source)  # the files by name: what a blob collected meanwhile is put back from
        for name in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(view / name, folder / name)
            except OSError:
                shutil.copyfile(view / name, folder / name)
        self._commit(folder, key, text, replace, deep=False)
        return self.artifact_dir(key)

    def _sealed(self, folder: Path, key: str) -> bytes:
        """The text of the sealed manifest of ``key`` in ``folder``. Raises ValueError: it is another key's."""
        text = (folder / MANIFEST).read_bytes()
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("key") != key:
            raise ValueError(f"{folder / MANIFEST} is not the manifest of key {key[:12]}")
        return text

    def _commit(self, folder: Path, key: str, text: bytes, replace: bool, deep: bool) -> None:
        """Store the blobs (an existing one checked by digest with ``deep``), logs and manifest ``text`` of the
        sealed ``folder`` as the artifact of ``key`` (see :meth:`publish`), then discard the folder."""
        raw = json.loads(text)
        found = self.lookup(key)
        stale = replace and found.hit and self.get_object(layout.manifest_path(key)) != text
        if not found.hit or stale:
            if found.damage is not None:
                self.quarantine(key, found.damage)
            files = raw.get("files") or {}
            for name, ent in files.items():
                if not (folder / name).is_file() or (folder / name).stat().st_size != ent["size"]:
                    raise ValueError(f"{folder / name} is missing or not {ent['size']} bytes as its manifest says")
            for ent_name, ent in files.items():
                self._store_blob(ent["sha256"], folder / ent_name, deep)
            for name in raw.get("logs") or {}:
                if (folder / name).is_file():
                    self.put_object(layout.log_path(key, name), (folder / name).read_bytes())
            if stale:
                self.put_manifest(key, raw, replace=True)
            elif not self.put_manifest(key, raw) and not self.is_complete(key):
                self.repair(key)  # a damaged entry appeared between our check and our commit
                if not self.put_manifest(key, raw):
                    raise OSError(errno.EEXIST, f"{self.location}: could not commit {layout.manifest_path(key)}: "
                                                f"another writer keeps replacing it; retry the build")
            self._heal(folder, files)
            self._committed(folder, key, text, files)
        shutil.rmtree(folder, ignore_errors=True)

    def _heal(self, folder: Path, files: dict[str, Any]) -> None:
        """Put back blobs of a just-committed artifact that a concurrent collector removed."""
        for _ in range(HEAL_ROUNDS):
            gone = [(n, e) for n, e in files.items() if self.blob_size(e["sha256"]) != e["size"]]
            if not gone:
                return
            for name, ent in gone:
                self.medium.put_file(layout.blob_path(ent["sha256"]), folder / name, create_only=True)

    def _committed(self, folder: Path, key: str, text: bytes, files: dict[str, Any]) -> None:
        """After a commit: when ours won, the staged files become the local view (nothing is downloaded
        again)."""
        if self.cache is None or self.get_object(layout.manifest_path(key)) != text:
            return
        raw = json.loads(text)
        for name in raw.get("logs") or {}:
            (folder / name).unlink(missing_ok=True)
        view = self.view_dir(key)
        view.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._swap_view(folder, view, text, files)
        except OSError:
            pass



__all__ = ["HEAL_ROUNDS", "Publishing"]
