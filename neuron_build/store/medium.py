"""The medium a store is written on: a few whole-object primitives, everything else defined on them.

:class:`~neuron_build.store.core.Store` implements the whole contract (lookup, repair, publish, records,
releases, channels and their history) over one :class:`Medium`, in the way fsspec's ``AbstractFileSystem``
defines its many calls on a few primitives. The primitives, on relative POSIX paths of the layout
(:mod:`neuron_build.store.layout`):

- :meth:`Medium.get`: the bytes of an object with their version token, or None;
- :meth:`Medium.put` / :meth:`Medium.put_file`: write whole (readers see old or new bytes), optionally
  create-only (False when the object existed);
- :meth:`Medium.swap`: compare-and-swap on the version token (None: only when absent);
- :meth:`Medium.list`: every object under a folder, recursive;
- :meth:`Medium.delete`: remove (optionally only while the token is still the given one);
- :meth:`Medium.age`: seconds since the object was last written (or refreshed by :meth:`Medium.touch`);
- :meth:`Medium.size`: bytes, or None when absent.

Two implementations: :class:`FolderMedium` (a local folder: temporary name, fsync, rename; create-only by
hard link; swaps under a file lock) here, and the fsspec media (S3 with conditional writes, ``memory://``,
``file://``, any other filesystem) in :mod:`neuron_build.store.medium_fsspec`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import time
from pathlib import Path

from neuron_build.store.layout import LOCKS_DIR
from neuron_build.util import fsync_path, sha256_hex, temp_name, write_atomic

#: Chunk size of streaming copies and hashes, bytes.
CHUNK = 1 << 20
#: Seconds a swap waits for its short file lock before it counts as a lost race.
SWAP_LOCK_TIMEOUT_S = 30.0


def sort_key(rel: str) -> list[str]:
    """Listings sort by path component (``releases/m/..`` before ``releases/m-2/..``), on every medium."""
    return rel.split("/")


class Medium:
    """Whole objects at relative paths. Tokens of the base implementation are the sha256 of the bytes."""

    #: what to call the medium in messages
    protocol = "generic"

    def get(self, rel: str) -> tuple[bytes, str] | None:
        """(bytes, version token) of the object at ``rel``, or None when absent."""
        raise NotImplementedError

    def put(self, rel: str, data: bytes, create_only: bool = False) -> bool:
        """Write ``data`` at ``rel`` whole; with ``create_only`` keep an existing object and return False."""
        raise NotImplementedError

    def put_file(self, rel: str, src: Path, create_only: bool = False) -> bool:
        """:meth:`put` of the local file ``src`` (a large blob: streamed, never read whole)."""
        return self.put(rel, Path(src).read_bytes(), create_only)

    def lost_race(self, rel: str) -> bool:
        """True (once) when the last create-only :meth:`put_file` of ``rel`` returned False because a concurrent
        writer put the object meanwhile (it won the create-only race, or this call waited for its upload):
        that writer hashed what it sent, so the caller keeps the object by its size and does not read it back
        (a large blob would be downloaded again). False where the medium cannot tell."""
        return False

    def swap(self, rel: str, data: bytes, expected: str | None) -> bool:
        """Replace the object only while its token is ``expected`` (None: only when absent); False on a
        lost race."""
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Every object path under the folder ``prefix`` (recursive; hidden names skipped), by
        :func:`sort_key`."""
        raise NotImplementedError

    def delete(self, rel: str, token: str | None = None) -> bool:
        """Remove the object (only while its token is ``token`` when given); False when it was absent."""
        raise NotImplementedError

    def age(self, rel: str) -> float | None:
        """Seconds since the object was last written or touched; None when absent or unknown."""
        raise NotImplementedError

    def size(self, rel: str) -> int | None:
        """Size in bytes, or None when absent."""
        raise NotImplementedError

    # -- defined on the primitives; media override them where they can do better ---------------------
    def touch(self, rel: str, src: Path) -> bool:
        """Refresh the age of the object at ``rel`` (whose bytes are the local file ``src``'s), so a
        collector running now counts it as young. Rewrites it when the medium cannot do better; False when
        it is absent."""
        if self.size(rel) is None:
            return False
        self.put_file(rel, src)
        return True

    def get_many(self, rels: list[str]) -> list[bytes | None]:
        """The bytes of many objects (None where absent), fetched concurrently where the medium can."""
        out = []
        for r in rels:
            got = self.get(r)
            out.append(None if got is None else got[0])
        return out

    def hash(self, rel: str) -> str | None:
        """sha256 of the stored bytes (streamed), or None when absent."""
        got = self.get(rel)
        return None if got is None else sha256_hex(got[0])

    def get_files(self, pairs: list[tuple[str, Path]]) -> list[str]:
        """Copy each object ``rel`` to the local file ``dest`` (fsynced); the sha256 of each, in order.

        Raises:
            FileNotFoundError: an object is absent.
        """
        out = []
        for rel, dest in pairs:
            got = self.get(rel)
            if got is None:
                raise FileNotFoundError(errno.ENOENT, f"no object {rel}", rel)
            with open(dest, "wb") as f:
                f.write(got[0])
                f.flush()
                os.fsync(f.fileno())
            out.append(sha256_hex(got[0]))
        return out

    def move(self, src: str, dest: str) -> bool:
        """Move an object to another path (a copy then a delete where there is no rename); False when
        ``src`` was absent."""
        got = self.get(src)
        if got is None:
            return False
        self.put(dest, got[0])
        self.delete(src)
        return True

    def invalidate(self) -> None:
        """Forget any cached listing (after an outside writer changed the medium)."""


class FolderMedium(Medium):
    """A local folder (or a shared mount): temporary name, fsync, rename; create-only by hard link; swaps
    under a short file lock in ``<root>/locks/swap/``, so they hold across processes (and across hosts of a
    mount whose locks work).

    Raises (every method):
        ValueError: a path that is absolute, empty or leaves the folder (``..``).
    """

    protocol = "file"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        """The local file of ``rel`` (checked: relative, inside the folder)."""
        parts = rel.split("/")
        if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"object path {rel!r} is not a relative path inside the store")
        return self.root.joinpath(*parts)

    def get(self, rel):
        try:
            data = self.path(rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return data, sha256_hex(data)

    def put(self, rel, data, create_only=False):
        f = self.path(rel)
        for _ in range(3):  # a concurrent delete may remove the (empty) folder between mkdir and open
            try:
                return write_atomic(f, data, create_only=create_only)
            except FileNotFoundError:
                continue
        return write_atomic(f, data, create_only=create_only)

    def put_file(self, rel, src, create_only=False):
        """Link (or copy) ``src`` to a temporary name, fsync, make it read-only (blobs are immutable and
        views hard-link them), then rename it into place. Create-only keeps an existing name (False); the
        files written this way are content-addressed, so two writers racing past that check write the same
        bytes and the later rename is harmless."""
        dest = self.path(rel)
        if create_only and os.path.lexists(dest):
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        try:
            try:
                os.link(src, tmp)  # the staging file becomes the blob: no copy of a large NEFF
            except OSError:
                shutil.copyfile(src, tmp)
            fsync_path(tmp)
            try:
                os.chmod(tmp, 0o444)
            except OSError:
                pass
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        try:
            fsync_path(dest.parent)
        except OSError:
            pass
        return True

    def swap(self, rel, data, expected):
        from filelock import FileLock, Timeout

        lock = self.root / LOCKS_DIR / "swap" / (rel.replace("/", "__") + ".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(str(lock), timeout=SWAP_LOCK_TIMEOUT_S):
                cur = self.get(rel)
                if (cur[1] if cur else None) != expected:
                    return False
                return self.put(rel, data)
        except Timeout:
            return False

    def list(self, prefix):
        base = self.path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return []
        out = []
        for d, _, files in os.walk(base):
            rel_d = Path(os.path.relpath(d, self.root)).as_posix()
            out.extend(f"{rel_d}/{f}" if rel_d != "." else f for f in files if not f.startswith("."))
        return sorted(out, key=sort_key)

    def delete(self, rel, token=None):
        f = self.path(rel)
        if token is not None:
            cur = self.get(rel)
            if cur is None or cur[1] != token:
                return False
        try:
            f.unlink()
        except FileNotFoundError:
            return False
        d = f.parent
        while d != self.root:  # drop folders the delete left empty (an object store has no folders)
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent
        return True

    def age(self, rel):
        try:
            return max(0.0, time.time() - os.lstat(self.path(rel)).st_mtime)
        except OSError:
            return None

    def size(self, rel):
        try:
            return os.stat(self.path(rel)).st_size
        except OSError:
            return None

    def touch(self, rel, src):
        try:
            os.utime(self.path(rel))
        except FileNotFoundError:
            return False
        except OSError:  # a blob we may not touch (another user's): rewrite is no better
            pass
        return True

    def get_many(self, rels):
        out = []
        for r in rels:
            try:
                out.append(self.path(r).read_bytes())
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                out.append(None)
        return out

    def hash(self, rel):
        h = hashlib.sha256()
        try:
            with open(self.path(rel), "rb") as f:
                while b := f.read(CHUNK):
                    h.update(b)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return h.hexdigest()

    def get_files(self, pairs):
        out = []
        for rel, dest in pairs:
            h = hashlib.sha256()
            try:
                fi = open(self.path(rel), "rb")
            except (FileNotFoundError, NotADirectoryError):
                raise FileNotFoundError(errno.ENOENT, f"no object {rel}", str(self.path(rel))) from None
            with fi, open(dest, "wb") as fo:
                while b := fi.read(CHUNK):
                    h.update(b)
                    fo.write(b)
                fo.flush()
                os.fsync(fo.fileno())
            out.append(h.hexdigest())
        return out

    def move(self, src, dest):
        d = self.path(dest)
        d.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(self.path(src), d)
        except FileNotFoundError:
            return False
        return True


__all__ = ["CHUNK", "FolderMedium", "Medium", "sort_key"]
