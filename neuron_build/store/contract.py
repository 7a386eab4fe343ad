"""The store contract: what every store implementation promises, method by method.

The shape is Bazel's remote cache (``remote_execution.proto``): an **action cache** that maps a target
key to its manifest, and the artifact's files, which the manifest lists by sha256 and size. Beside them
sit the small records a build keeps (target records, failure records, results), the release records,
the channel pointers with their history, and the coordination of builders (key locks, the host-memory
budget). Nothing outside ``neuron_build.store`` computes a path inside a store: callers use these
methods, and ``tests/store/test_contract.py`` runs one suite against every implementation.

Invariants that hold for every method:

- **A reader trusts only a complete artifact.** An artifact is complete when its manifest parses,
  matches its own sha256, names the key it is stored under, says PASS, and every blob it lists is present
  with the listed size (and, on a deep check, hashes to its name). Anything else is *damaged* and is never
  served. The build's logs (``logs``, not byte-stable) are no part of this check and no release pins them.
- **Publishing is atomic.** A reader sees a complete artifact or none; a writer killed at any moment
  leaves no artifact that passes the check above.
- **Records are whole.** Every record is replaced atomically (old or new content, never torn);
  release records are written once and never replaced.
- **Reads do not write.** Only :meth:`ArtifactStore.repair`, :meth:`ArtifactStore.quarantine`,
  publishing and the record writers change the store (and :meth:`ActionCache.artifact_dir` builds a local
  view). A store opened read-only (``read_only``) serves every read; ``repair`` then only reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from neuron_build.store.records import FailureRecord, TargetRecord

if TYPE_CHECKING:  # pydantic stays off the import path of the contract
    from neuron_build.store.manifest import Manifest


@dataclass(frozen=True)
class Lookup:
    """The answer of :meth:`ArtifactStore.lookup`: a hit (``manifest`` set), an absent key (both None),
    or a damaged object (``damage`` says why, ``blob`` names a damaged blob; ``manifest`` None). A typed
    miss, never an exception."""

    key: str
    manifest: Manifest | None = None
    damage: str | None = None
    #: the sha256 of the blob the damage is about (missing, wrong size or digest), when it is one
    blob: str | None = None
    #: For a read-through store's hit: ``local`` or ``remote`` (where the artifact was found); else None.
    location: str | None = None

    @property
    def hit(self) -> bool:
        """True when the store holds a complete artifact for the key."""
        return self.manifest is not None


@runtime_checkable
class ActionCache(Protocol):
    """Key -> manifest -> files: what a build looks up and publishes."""

    #: Where the store is, for messages (a folder path or a URL). Never part of a key.
    location: str

    def lookup(self, key: str, deep: bool = False) -> Lookup:
        """Is there a complete artifact for ``key``? Reads only: a damaged object stays where it is.

        Cheap by default (one small manifest read and one size per blob); ``deep`` also hashes every blob.
        """
        ...

    def repair(self, key: str, deep: bool = False) -> Lookup:
        """:meth:`lookup`, and move a damaged object out of the way (quarantine, with its reason), so the
        next build compiles the key again. The lookup of commands that write (build, show)."""
        ...

    def is_complete(self, key: str, deep: bool = False) -> bool:
        """``lookup(key, deep).hit``."""
        ...

    def is_cached(self, key: str) -> bool:
        """Is the artifact of ``key`` complete in this host's copy: the local cache of a read-through
        store, the store itself otherwise? The up-to-date check of a doit ``build:`` task: it may answer
        from an index validated by file signatures instead of parsing the manifest. Reads only."""
        ...

    def manifest(self, key: str) -> Manifest | None:
        """The manifest of a complete artifact, else None (reads only)."""
        ...

    def artifact_dir(self, key: str) -> Path:
        """A local folder holding the artifact's files under the names its manifest lists (and the
        manifest as ``manifest.json``), for loading. Call after a hit; the files are not verified again.

        Raises:
            FileNotFoundError: the key has no manifest.
        """
        ...

    def keys(self) -> list[str]:
        """Every key the action cache has an entry for (complete or not), sorted."""
        ...

    def find_keys(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix`` (at least 2 hex chars), sorted."""
        ...

    def manifests(self) -> Iterator[Manifest]:
        """The manifest of every complete artifact, in key order."""
        ...

    def new_staging(self, key: str) -> Path:
        """A fresh, private local folder to write an artifact of ``key`` into, on the store's side of any
        rename. Nothing reads it as an artifact."""
        ...

    def seal(self, folder: Path, manifest: Manifest) -> dict[str, Any]:
        """Make ``folder`` durable and write its ``manifest.json`` last (with the manifest's own sha256).

        Returns:
            The manifest as written.

        Raises:
            OSError: e.g. ENOSPC; nothing is published.
        """
        ...

    def publish(self, folder: Path, key: str, replace: bool = False) -> Path:
        """Make a sealed folder the artifact of ``key``, atomically: every file the manifest lists goes in
        as :meth:`put_blob` stores it (under the digest its sealer computed, its size checked: each file is
        hashed once, by the sealer), the logs it lists under ``logs/<key>/``, then the manifest by
        :meth:`put_manifest` (the commit point). When a complete artifact already exists (another builder
        won), the folder is discarded and the existing one kept, unless ``replace`` (the builder found the
        existing one stale: an input its build recorded changed): then the new manifest replaces it, in
        one write, after the new blobs are in; a damaged manifest in the way is quarantined first.

        Returns:
            The artifact's folder (:meth:`artifact_dir`).
        """
        ...

    def publish_as(self, folder: Path, key: str, source: str, replace: bool = False) -> Path:
        """:meth:`publish` a sealed folder that holds only the logs of ``key``'s manifest, whose files are
        exactly those of ``source``'s complete artifact: "publish key B over key A's blobs" (a graph reuse).
        Each of ``source``'s blobs is verified by digest once; no artifact file is copied.

        Raises:
            ValueError: ``source`` is not complete in this store, lists other files, or a blob of it is
                damaged; nothing is published.
        """
        ...

    def quarantine(self, key: str, reason: str) -> str | None:
        """Move the object of ``key`` out of the action cache with ``reason``; it is never served again.

        Returns:
            Where it went (relative to the store), or None when there was nothing to move.
        """
        ...

    def clean_staging(self) -> int:
        """Remove staging folders of builders that are no longer running on this host; how many."""
        ...

    # -- blobs and manifests one by one: what publish is made of, and what push / fetch copy -----------
    def blob_size(self, sha256: str) -> int | None:
        """Size in bytes of blob ``sha256`` (``cas/<sha[:2]>/<sha>``), or None when absent. Reads only."""
        ...

    def put_blob(self, sha256: str, src: Path) -> bool:
        """Store the local file ``src`` as blob ``sha256``, create-only (S3: ``If-None-Match: *``).

        An intact existing blob is kept (returns False, nothing written). An existing blob whose size or
        digest differs (rot, tampering) is replaced: a deterministic rebuild heals what pins it.

        Raises:
            ValueError: ``src``'s sha256 is not ``sha256``.
            OSError: the write failed; no blob of that name is left half-written.
        """
        ...

    def get_blob(self, sha256: str, dest: Path) -> None:
        """Copy blob ``sha256`` to the local file ``dest`` (written atomically), verifying its digest.

        Raises:
            FileNotFoundError: no such blob.
            ValueError: the stored bytes do not hash to ``sha256`` (``dest`` is not written).
        """
        ...

    def raw_manifest(self, key: str) -> dict[str, Any] | None:
        """The action-cache entry of ``key`` as stored (parsed JSON, unchecked), or None."""
        ...

    def put_manifest(self, key: str, raw: dict[str, Any], replace: bool = False) -> bool:
        """Commit ``key``: write its manifest create-only, after every blob it lists is stored (with
        ``replace``: overwrite an existing entry, in one atomic write).

        Returns:
            False (nothing written) when an entry exists already and not ``replace``.
        """
        ...


@runtime_checkable
class RecordStore(Protocol):
    """The small records beside the artifacts: target records, failure records, results."""

    def put_target(self, record: TargetRecord) -> None:
        """Remember the key a target was last built with (replaces the previous record)."""
        ...

    def target(self, target_id: str) -> TargetRecord | None:
        """The target's record, or None."""
        ...

    def targets(self, model: str, bucket_id: str | None = None) -> Iterator[TargetRecord]:
        """The records of ``model``'s targets (of one bucket when ``bucket_id`` is given), by target id."""
        ...

    def all_targets(self) -> Iterator[TargetRecord]:
        """Every target record in the store."""
        ...

    def recorded_imports(self, model: str) -> list[str]:
        """The project files (POSIX paths relative to the project folder) that builds of ``model`` recorded
        as imported (the worker lists them); empty when none was recorded. Part of the next plan's key."""
        ...

    def add_recorded_imports(self, model: str, files: list[str]) -> list[str]:
        """Add ``files`` to ``model``'s recorded imports (a union, written atomically); returns the new set,
        sorted. Two builders adding at once may lose one's addition: that costs a rebuild, never a stale
        hit (every artifact's key holds the files its own build recorded)."""
        ...

    def put_failure(self, record: FailureRecord, log: bytes) -> None:
        """Record a failed compile of ``record.target`` and its log (replaces the previous failure)."""
        ...

    def failure(self, target_id: str) -> FailureRecord | None:
        """The target's last recorded failure, or None."""
        ...

    def failures(self, model: str, bucket_id: str | None = None) -> Iterator[FailureRecord]:
        """The failure records of ``model``'s targets (of one bucket when given)."""
        ...

    def failure_log(self, target_id: str) -> Path:
        """Where the log of the target's last failure is (for ``show`` to print)."""
        ...

    def clear_failure(self, target_id: str) -> None:
        """Forget the target's failure (after it passed)."""
        ...

    def put_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> None:
        """Store a result about an artifact (``kind`` ``validation`` or ``bench``; ``name`` e.g. the
        device kind). Results never change the artifact or its key; a new one replaces the old."""
        ...

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        """A stored result, or None."""
        ...

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        """Every result of one kind for an artifact: {name: result}, by name."""
        ...


@runtime_checkable
class ReleaseStore(Protocol):
    """Release records (written once), channel pointers (moved by compare-and-swap) and their history."""

    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        """Write a release record once. Returns False (and changes nothing) when it already exists."""
        ...

    def release(self, model: str, release_id: str) -> dict[str, Any] | None:
        """A release record by its exact id, or None."""
        ...

    def release_ids(self, model: str, prefix: str = "") -> list[str]:
        """The ids of ``model``'s releases that start with ``prefix``, sorted."""
        ...

    def releases(self, model: str | None = None) -> Iterator[tuple[str, str, Any]]:
        """(model, release id, record or None when unreadable) for every release (of one model)."""
        ...

    def channel_ref(self, model: str, channel: str) -> tuple[dict[str, Any] | None, str | None]:
        """The channel's pointer with its version token (an ETag, a content digest), or (None, None)."""
        ...

    def swap_channel(self, model: str, channel: str, pointer: dict[str, Any], expected: str | None) -> bool:
        """Compare-and-swap: replace the pointer only when its version token is still ``expected`` (None:
        only when there is no pointer). Returns False on a lost race (S3: 412 or 409); the caller reads
        the pointer again, checks again and retries."""
        ...

    def channel(self, model: str, channel: str) -> dict[str, Any] | None:
        """The pointer of a channel (``release``, ``version``, ...), or None when it never held one."""
        ...

    def channels(self) -> Iterator[tuple[str, str, Any]]:
        """(model, channel, pointer or None when unreadable) for every channel pointer in the store."""
        ...

    def append_history(self, model: str, channel: str, entry: dict[str, Any]) -> None:
        """Add one entry to the channel's history: a new object under
        :func:`~neuron_build.store.layout.history_dir`, named so that names sort by time (plus a random
        token), written create-only. Never an append: two writers' entries are both kept."""
        ...

    def history(self, model: str, channel: str) -> list[dict[str, Any]]:
        """The channel's history, oldest first (unreadable entries skipped)."""
        ...


@runtime_checkable
class Coordination(Protocol):
    """What builders that share the store use to stay out of each other's way."""

    def key_lock(self, key: str, target: str = "", heartbeat_s: float = 15.0) -> Any:
        """The exclusive compile lock of ``key`` (a :class:`~neuron_build.store.locks.KeyLock`): one
        builder compiles, the others wait and reuse."""
        ...

    def memory_budget(self, max_bytes: int | None, heartbeat_s: float = 15.0) -> Any:
        """The host-memory ledger of the compiles running on this host (a
        :class:`~neuron_build.store.budget.MemoryBudget`)."""
        ...


@runtime_checkable
class ObjectIO(Protocol):
    """Whole small objects at layout paths (:mod:`neuron_build.store.layout`), the primitive the ledger,
    leases and history entries are built on inside ``neuron_build.store``. Paths are relative POSIX text."""

    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:
        """Write ``data`` at ``path`` atomically (readers see old or new bytes, never a torn object).
        With ``create_only`` (S3: ``If-None-Match: *``) an existing object is kept and False returned."""
        ...

    def get_object(self, path: str) -> bytes | None:
        """The bytes at ``path``, or None when absent."""
        ...

    def list_objects(self, prefix: str) -> list[str]:
        """Every object path under the folder ``prefix`` (recursive), sorted."""
        ...

    def delete_object(self, path: str) -> bool:
        """Remove the object at ``path``; False when it was absent."""
        ...


@runtime_checkable
class Tiers(Protocol):
    """Where a store is and what it is in front of: every store answers these, so no caller probes an
    implementation (``getattr``, ``isinstance``). A read-through pair (:mod:`neuron_build.store.tiered`)
    answers for its two tiers; a single store is its own local tier and has no remote."""

    #: The store serves reads only: every write raises, ``repair`` only reports.
    read_only: bool
    #: (key, one-line reason) of artifacts built here whose push to the remote failed in this process.
    push_failures: list[tuple[str, str]]

    @property
    def remote_location(self) -> str | None:
        """The URL of the shared store this one reads through to, or None."""
        ...

    @property
    def local_tier(self) -> ArtifactStore:
        """The store on this host that builds stage and publish into (the store itself, or the local
        store of a read-through pair)."""
        ...

    @property
    def remote_tier(self) -> ArtifactStore | None:
        """The shared store of a read-through pair, else None."""
        ...

    @property
    def folder(self) -> Path | None:
        """The local folder of a folder store (of the local tier of a pair), else None."""
        ...

    def pending(self) -> set[str]:
        """Keys built here whose push to the remote has not succeeded yet (empty without a remote)."""
        ...

    def push_pending(self) -> list[tuple[str, str]]:
        """Retry the pending pushes; (key, reason) of those that failed again (empty without a remote)."""
        ...

    def log_file(self, key: str, name: str) -> Path:
        """A local file of the build log ``name`` of ``key``'s artifact (it may not exist)."""
        ...


@runtime_checkable
class ArtifactStore(ActionCache, RecordStore, ReleaseStore, Coordination, ObjectIO, Tiers, Protocol):
    """A whole store: the narrow protocols above, each usable alone as a parameter type by code that
    needs only that part (see the module docstring for the invariants of every call)."""


__all__ = ["ActionCache", "ArtifactStore", "Coordination", "Lookup", "ObjectIO", "RecordStore", "ReleaseStore",
           "Tiers"]
