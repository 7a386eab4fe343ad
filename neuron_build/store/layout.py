"""The store layout, shared by every implementation: one relative POSIX path per thing a store holds.

A local folder and a remote prefix (``s3://bucket/prefix``) hold the same tree, so ``push`` and ``fetch``
copy paths one for one. The shape is Bazel's remote cache: an action cache (``ac/``) whose entries are
manifests, and a content-addressed store (``cas/``) of blobs by sha256::

    ac/<key[:2]>/<key>.json                  manifest of key: its files by sha256 and size (the commit point)
    cas/<sha[:2]>/<sha>                      one blob, stored once, immutable
    logs/<key>/<name>                        the build's logs of an artifact (not byte-stable: never pinned)
    targets/<target id>/last.json            the last key built for a target, with its key details
    targets/<target id>/failure.json         the target's last failed compile (and failure.log)
    targets/<model>/imports.json             the project files builds of the model recorded as imported
    targets/<model>/reads.json               (older versions only: no longer written or read; ``verify``
                                             checks one still parses)
    graphs/<graph key[:2]>/<graph key>.json  the graph index: graph key -> the action-cache key holding its
                                             artifact (:mod:`neuron_build.store.graph_index`)
    neuron-cache/neuronxcc-<version>/<target id>.json   NxDI's persistent compile cache: the action-cache key
                                             whose artifact holds the cache entries (NEFFs) that target's last
                                             compile used (:mod:`neuron_build.compilers.neuron.nxdi_cache`)
    results/<key>/<kind>/<name>.json         validation and benchmark results of an artifact
    releases/<model>/<release id>.json       release records, written once
    channels/<model>/<channel>.json          a channel pointer, moved by compare-and-swap
    channels/<model>/<channel>.history/<entry>.json   one object per promotion, refusal and rollback
    leases/<key>.json                        who compiles a key now, across hosts (owner, expiry)
    ledger/<yyyy-mm-dd>/<time>-<host>-<token>.json   the build ledger: one immutable record per compile
                                             attempt, cache hit or reuse (:mod:`neuron_build.store.ledger`)
    failures/<target id>/<time>-<token>/...  kept workdirs of failed compiles (entry.json, request, logs,
                                             the compiler's workdir), bounded (:mod:`neuron_build.store.failures`)
    quarantine/<name>.<token>/               damaged objects moved aside, with reason.txt (never served)
    store-id.json                            the store's identity (a random id, written once), so hosts
                                             can tell they see the same store (:mod:`neuron_build.store.identity`)

Local-only areas (never pushed): ``staging/`` (artifacts being written), ``views/<key[:2]>/<key>/``
(an artifact's blobs hard-linked under their file names, for loading), ``locks/`` (per-key file locks,
the host-memory ledger), ``trash/`` (what gc is removing), ``pending-push/<key>`` (artifacts built
here whose push to the remote failed; the next build retries them).
"""

from __future__ import annotations

import re

#: The areas, each spelled here once. Shared areas (a remote store holds them too; push and fetch copy
#: within these): the action cache, the content-addressed store, build logs, target records, results,
#: releases, channels, leases, quarantine, the ledger, kept failure workdirs, the graph index and the NxDI
#: persistent-cache pointers.
AC_DIR = "ac"
CAS_DIR = "cas"
LOGS_DIR = "logs"
TARGETS_DIR = "targets"
RESULTS_DIR = "results"
RELEASES_DIR = "releases"
CHANNELS_DIR = "channels"
LEASES_DIR = "leases"
QUARANTINE_DIR = "quarantine"
#: The ledger's area: one folder per UTC day, one object per record.
LEDGER_DIR = "ledger"
#: The area of kept failure workdirs: one folder per target, one per kept failure.
FAILURES_DIR = "failures"
#: The graph index's area.
GRAPHS_DIR = "graphs"
#: The NxDI persistent-cache area: ``neuron-cache/neuronxcc-<compiler version>/<target id>.json`` names the
#: action-cache key whose artifact holds the libneuronxla cache entries that target's last compile used
#: (:mod:`neuron_build.compilers.neuron.nxdi_cache`).
NEURON_CACHE_DIR = "neuron-cache"
#: Local-only areas: staging folders, views, file locks (and the host-memory ledger), gc's trash, and the
#: markers of pushes that failed.
STAGING_DIR = "staging"
VIEWS_DIR = "views"
LOCKS_DIR = "locks"
TRASH_DIR = "trash"
PENDING_DIR = "pending-push"

#: Areas a remote store holds too; push and fetch copy within these.
SHARED_AREAS = (AC_DIR, CAS_DIR, LOGS_DIR, TARGETS_DIR, RESULTS_DIR, RELEASES_DIR, CHANNELS_DIR, LEASES_DIR,
                QUARANTINE_DIR, LEDGER_DIR, FAILURES_DIR, GRAPHS_DIR, NEURON_CACHE_DIR)
#: Areas only a local folder has.
LOCAL_AREAS = (STAGING_DIR, VIEWS_DIR, LOCKS_DIR, TRASH_DIR, PENDING_DIR)

#: The file name of a manifest in an artifact folder (a view, a pull, a staging folder).
MANIFEST = "manifest.json"
#: The store's identity object.
STORE_ID_PATH = "store-id.json"
#: A folder store's index of lookups validated by file signatures (:class:`~neuron_build.store.local.LocalStore`).
LOOKUP_INDEX = f"{LOCKS_DIR}/lookup-index.json"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_digest(name: str) -> bool:
    """Is ``name`` a key or a blob digest (64 lowercase hex chars)?"""
    return bool(_HEX64.match(name))


def ac_dir(prefix: str = "") -> str:
    """The action cache (``ac``), or the folder of keys starting with ``prefix[:2]`` (``ac/<prefix[:2]>``)."""
    return f"{AC_DIR}/{prefix[:2]}" if prefix else AC_DIR


def logs_dir(key: str | None = None) -> str:
    """The build logs of ``key``'s artifact (``logs/<key>``), or the logs area (``logs``)."""
    return f"{LOGS_DIR}/{key}" if key else LOGS_DIR


def results_dir(key: str, kind: str | None = None) -> str:
    """The results of ``key``'s artifact (``results/<key>``), of one kind (``results/<key>/<kind>``)."""
    return f"{RESULTS_DIR}/{key}/{kind}" if kind else f"{RESULTS_DIR}/{key}"


def targets_dir(model: str | None = None, bucket_id: str | None = None) -> str:
    """The target records of every target, of one model's, or of one bucket's (``targets[/m[/b]]``)."""
    return TARGETS_DIR + (f"/{model}" if model is not None else "") + (
        f"/{bucket_id}" if model is not None and bucket_id is not None else "")


def releases_dir(model: str | None = None) -> str:
    """Every release record (``releases``), or one model's (``releases/<model>``)."""
    return f"{RELEASES_DIR}/{model}" if model is not None else RELEASES_DIR


def quarantine_dir(name: str, token: str) -> str:
    """Where a damaged object named ``name`` goes, with its ``reason.txt``: ``quarantine/<name>.<token>``."""
    return f"{QUARANTINE_DIR}/{name}.{token}"


def trash_path(name: str, token: str) -> str:
    """Where gc moves an object it is about to delete, for a second look: ``trash/<name>.<token>`` (on a
    remote too, for the moment between the move and the delete)."""
    return f"{TRASH_DIR}/{name}.{token}"


def manifest_path(key: str) -> str:
    """The action-cache entry of ``key``: ``ac/<key[:2]>/<key>.json``."""
    return f"{AC_DIR}/{key[:2]}/{key}.json"


def blob_path(sha256: str) -> str:
    """The blob with digest ``sha256``: ``cas/<sha[:2]>/<sha>``."""
    return f"{CAS_DIR}/{sha256[:2]}/{sha256}"


def log_path(key: str, name: str) -> str:
    """A build log of ``key``'s artifact (``worker.log``, ``compile.log``)."""
    return f"{LOGS_DIR}/{key}/{name}"


def target_path(target_id: str, name: str = "last.json") -> str:
    """A record of one target (``last.json``, ``failure.json``, ``failure.log``)."""
    return f"{TARGETS_DIR}/{target_id}/{name}"


def imports_path(model: str) -> str:
    """The project files builds of ``model`` recorded as imported (part of the next plan's key)."""
    return f"{TARGETS_DIR}/{model}/imports.json"


def graph_path(graph_key: str) -> str:
    """The graph index entry of ``graph_key``: ``graphs/<graph key[:2]>/<graph key>.json``."""
    return f"{GRAPHS_DIR}/{graph_key[:2]}/{graph_key}.json"


def neuron_cache_path(compiler_version: str, target_id: str) -> str:
    """The NxDI cache pointer of ``target_id`` for neuronx-cc ``compiler_version``."""
    return f"{NEURON_CACHE_DIR}/neuronxcc-{compiler_version}/{target_id}.json"


def result_path(key: str, kind: str, name: str) -> str:
    """A result of ``kind`` (``validation``, ``bench``) named ``name`` (a device kind) about ``key``."""
    return f"{RESULTS_DIR}/{key}/{kind}/{name}.json"


def release_path(model: str, release_id: str) -> str:
    """A release record."""
    return f"{RELEASES_DIR}/{model}/{release_id}.json"


def channel_path(model: str, channel: str) -> str:
    """A channel pointer."""
    return f"{CHANNELS_DIR}/{model}/{channel}.json"


def history_dir(model: str, channel: str) -> str:
    """The folder of a channel's history entries (one object each, named so that names sort by time)."""
    return f"{CHANNELS_DIR}/{model}/{channel}.history"


def lease_path(key: str) -> str:
    """The cross-host compile lease of ``key``."""
    return f"{LEASES_DIR}/{key}.json"


def ledger_day_dir(day: str) -> str:
    """The ledger folder of one UTC day (``day`` is ``yyyy-mm-dd``)."""
    return f"{LEDGER_DIR}/{day}"


def ledger_path(day: str, name: str) -> str:
    """One ledger record: ``ledger/<yyyy-mm-dd>/<name>.json``; ``name`` is ``<HHMMSS.ffffff>Z-<host>-<token>``,
    so names sort by time within a day and two writers never pick the same one."""
    return f"{LEDGER_DIR}/{day}/{name}.json"


def failures_dir(target_id: str | None = None) -> str:
    """The kept failure workdirs of one target (``failures/<target id>``), or of all (``failures``)."""
    return f"{FAILURES_DIR}/{target_id}" if target_id else FAILURES_DIR


def failure_entry_path(target_id: str, entry: str, name: str = "entry.json") -> str:
    """A file of one kept failure workdir: ``failures/<target id>/<entry>/<name>``; ``entry`` is
    ``<yyyymmddTHHMMSS.ffffff>Z-<token>`` (sorts by time); ``entry.json`` describes it."""
    return f"{FAILURES_DIR}/{target_id}/{entry}/{name}"


def view_dir(key: str) -> str:
    """The local view of ``key``'s artifact (its blobs under their file names): ``views/<key[:2]>/<key>``."""
    return f"{VIEWS_DIR}/{key[:2]}/{key}"


def pending_path(key: str) -> str:
    """The local marker of ``key``'s artifact, built here, whose push to the remote failed:
    ``pending-push/<key>`` (its content: the reason)."""
    return f"{PENDING_DIR}/{key}"


def lock_path(key: str, suffix: str = ".lock") -> str:
    """A folder store's file lock of ``key`` (``locks/<key>.lock``), or another file of it by ``suffix``
    (``.owner.json``: who holds it)."""
    return f"{LOCKS_DIR}/{key}{suffix}"


__all__ = [
    "AC_DIR", "CAS_DIR", "CHANNELS_DIR", "FAILURES_DIR", "GRAPHS_DIR", "LEASES_DIR", "LEDGER_DIR", "LOCAL_AREAS", "LOCKS_DIR",
    "LOGS_DIR", "LOOKUP_INDEX", "MANIFEST", "NEURON_CACHE_DIR", "PENDING_DIR", "QUARANTINE_DIR", "RELEASES_DIR", "RESULTS_DIR",
    "SHARED_AREAS", "STAGING_DIR", "STORE_ID_PATH", "TARGETS_DIR", "TRASH_DIR", "VIEWS_DIR",
    "ac_dir", "blob_path", "channel_path", "failure_entry_path", "failures_dir", "graph_path", "history_dir", "imports_path",
    "is_digest", "lease_path", "ledger_day_dir", "ledger_path", "lock_path", "log_path", "logs_dir", "manifest_path",
    "neuron_cache_path", "pending_path", "quarantine_dir", "release_path", "releases_dir", "result_path",
    "results_dir", "target_path", "targets_dir", "trash_path", "view_dir",
]
