"""The records of a store, whole small JSON objects at layout paths, written and read through its
:class:`~neuron_build.store.contract.ObjectIO` primitives: target and failure records, recorded imports,
results, release records (written once), channel pointers (moved by compare-and-swap) and their history
(one create-only object per entry). :class:`~neuron_build.store.core.Store` takes them from
:class:`JsonObjects`; its medium decides nothing here.

Two records have a home tier: releases, channels and their history are read from :attr:`JsonObjects.shared_tier`
(the store every host shares), failure records live in :attr:`JsonObjects.local_tier` (this host's). For a
store alone both are the store itself; a read-through store
(:class:`~neuron_build.store.tiered.ReadThroughStore`) names its remote and its local store, and so reads
and writes them there without a method of its own.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from neuron_build.store import layout
from neuron_build.store.digests import SELF_DIGEST, utc_now_us
from neuron_build.store.records import FailureRecord, TargetRecord
from neuron_build.util import canonical_json, json_bytes


def parse_object(data: bytes | None) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None when absent, not JSON, or not an object."""
    if data is None:
        return None
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


#: The field of a validation or benchmark result naming the manifest (its self digest) of the artifact judged.
JUDGED = "judged_manifest"


class JsonObjects:
    """Every record over the ObjectIO primitives (``get_object``, ``put_object``, ``list_objects``,
    ``delete_object``) and ``object_ref`` / ``swap_object`` (versions for compare-and-swap),
    ``get_many`` of the medium (many small reads at once)."""

    medium: Any

    @property
    def local_tier(self) -> Any:
        """The store on this host that builds stage and publish into, where its failure records live: this
        store."""
        return self

    @property
    def shared_tier(self) -> JsonObjects:
        """The store whose releases, channels and channel history this one reads (every host shares them):
        this store."""
        return self

    def get_object(self, path: str) -> bytes | None:  # provided by the implementation
        raise NotImplementedError

    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:  # provided likewise
        raise NotImplementedError

    def list_objects(self, prefix: str) -> list[str]:  # provided likewise
        raise NotImplementedError

    def delete_object(self, path: str) -> bool:  # provided likewise
        raise NotImplementedError

    def object_ref(self, path: str) -> tuple[bytes | None, str | None]:  # provided likewise
        raise NotImplementedError

    def swap_object(self, path: str, data: bytes, expected: str | None) -> bool:  # provided likewise
        raise NotImplementedError

    def _many_json(self, rels: list[str]) -> list[Any]:
        """The objects at ``rels`` parsed as JSON (None for one absent or not JSON), read at once."""
        out = []
        for data in self.medium.get_many(rels):
            try:
                out.append(json.loads(data) if data is not None else None)
            except ValueError:
                out.append(None)
        return out


    def raw_manifest(self, key: str) -> dict[str, Any] | None:
        """The stored manifest of ``key`` as parsed JSON, unchecked; None when absent or not a JSON object."""
        return parse_object(self.get_object(layout.manifest_path(key)))

    def _target_records(self, model: str | None, bucket_id: str | None) -> Iterator[TargetRecord]:
        for tid, raw in self._records("last.json", model, bucket_id):
            rec = TargetRecord.from_json(raw)
            if rec is not None:
                yield rec if rec.target == tid else replace(rec, target=tid)

    def targets(self, model: str, bucket_id: str | None = None) -> Iterator[TargetRecord]:
        return self._target_records(model, bucket_id)

    def all_targets(self) -> Iterator[TargetRecord]:
        return self._target_records(None, None)

    def recorded_imports(self, model: str) -> list[str]:
        raw = parse_object(self.get_object(layout.imports_path(model)))
        files = raw.get("files") if raw is not None else None
        return sorted(f for f in files if isinstance(f, str)) if isinstance(files, list) else []

    def add_recorded_imports(self, model: str, files: list[str]) -> list[str]:
        have = self.recorded_imports(model)
        new = sorted(set(have) | set(files))
        if new != have:
            self.put_object(layout.imports_path(model), canonical_json({"model": model, "files": new}))
        return new

    # -- records ----------------------------------------------------------------------------------
    def _get_json(self, rel: str) -> Any | None:
        data = self.get_object(rel)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None

    def _records(self, name: str, model: str | None, bucket_id: str | None) -> Iterator[tuple[str, Any]]:
        base = layout.targets_dir(model, bucket_id)
        rels = [r for r in self.list_objects(base) if r.rsplit("/", 1)[-1] == name]
        for rel, raw in zip(rels, self._many_json(rels), strict=True):
            yield rel[len(layout.TARGETS_DIR) + 1:].rsplit("/", 1)[0], raw

    def put_target(self, record: TargetRecord) -> None:
        self.put_object(layout.target_path(record.target), json_bytes(record.to_json()))

    def target(self, target_id: str) -> TargetRecord | None:
        return TargetRecord.from_json(self._get_json(layout.target_path(target_id)))

    def put_failure(self, record: FailureRecord, log: bytes) -> None:
        tier = self.local_tier
        tier.put_object(layout.target_path(record.target, "failure.log"), log)
        tier.put_object(layout.target_path(record.target, "failure.json"), json_bytes(record.to_json()))

    def failure(self, target_id: str) -> FailureRecord | None:
        return FailureRecord.from_json(self.local_tier._get_json(layout.target_path(target_id, "failure.json")))

    def failures(self, model: str, bucket_id: str | None = None) -> Iterator[FailureRecord]:
        for _, raw in self.local_tier._records("failure.json", model, bucket_id):
            rec = FailureRecord.from_json(raw)
            if rec is not None:
                yield rec

    def clear_failure(self, target_id: str) -> None:
        tier = self.local_tier
        for name in ("failure.json", "failure.log"):
            rel = layout.target_path(target_id, name)
            if tier.get_object(rel) is not None:
                tier.delete_object(rel)

    def _judged(self, key: str) -> str | None:
        """The self digest of ``key``'s manifest now (None: no artifact): what a result judged. A stale
        artifact rebuilt under its key (a recorded read changed: new weights) has another manifest, so the
        old artifact's validation and benchmarks no longer speak for it."""
        man = self.manifest(key)  # type: ignore[attr-defined]  (the Store this mixes into)
        return None if man is None else getattr(man, SELF_DIGEST, None)

    def put_result(self, key: str, kind: str, name: str, result: dict[str, Any]) -> None:
        result = {**result, JUDGED: self._judged(key)}  # what it judged: this store's manifest of the key now
        self.put_object(layout.result_path(key, kind, name), json_bytes(result))

    def result(self, key: str, kind: str, name: str) -> dict[str, Any] | None:
        got = self._get_json(layout.result_path(key, kind, name))
        if got is None or got.get(JUDGED) != self._judged(key):
            return None
        return {k: v for k, v in got.items() if k != JUDGED}

    def results(self, key: str, kind: str) -> dict[str, dict[str, Any]]:
        rels = [r for r in self.list_objects(layout.results_dir(key, kind)) if r.endswith(".json") and r.count("/") == 3]
        if not rels:
            return {}
        now = self._judged(key)  # a result of another artifact under this key (or unstamped) is not its own
        return {r.rsplit("/", 1)[-1][:-5]: {k: x for k, x in v.items() if k != JUDGED}
                for r, v in zip(rels, self._many_json(rels), strict=True) if v is not None and v.get(JUDGED) == now}

    # -- releases, channels and their history ----------------------------------------------------
    def put_release(self, model: str, release_id: str, record: dict[str, Any]) -> bool:
        return self.put_object(layout.release_path(model, release_id), json_bytes(record), create_only=True)

    def release(self, model: str, release_id: str) -> dict[str, Any] | None:
        return self.shared_tier._get_json(layout.release_path(model, release_id))

    def _named(self, base: str) -> list[str]:
        return [r for r in self.list_objects(base) if r.count("/") == 2 and r.endswith(".json")]

    def release_ids(self, model: str, prefix: str = "") -> list[str]:
        rels = self.shared_tier._named(layout.releases_dir(model))
        return sorted(n for n in (r.rsplit("/", 1)[-1][:-5] for r in rels) if n.startswith(prefix))

    def releases(self, model: str | None = None) -> Iterator[tuple[str, str, Any]]:
        return self.shared_tier._named_objects(layout.releases_dir(model))

    def _named_objects(self, base: str) -> Iterator[tuple[str, str, Any]]:
        """(model, name, parsed JSON) of every ``<base>/<model>/<name>.json``."""
        rels = self._named(base)
        for rel, raw in zip(rels, self._many_json(rels), strict=True):
            _, m, name = rel.split("/")
            yield m, name[:-5], raw

    def channel(self, model: str, channel: str) -> dict[str, Any] | None:
        raw = self.shared_tier._get_json(layout.channel_path(model, channel))
        return raw if isinstance(raw, dict) else None

    def channels(self) -> Iterator[tuple[str, str, Any]]:
        return self.shared_tier._named_objects(layout.CHANNELS_DIR)

    def channel_ref(self, model: str, channel: str) -> tuple[dict[str, Any] | None, str | None]:
        """The pointer and its token (S3: the ETag; else the sha256 of its bytes). An unparsable pointer
        reads as (None, token), so a swap may replace it."""
        data, token = self.shared_tier.object_ref(layout.channel_path(model, channel))
        if data is None:
            return None, None
        return parse_object(data), token

    def swap_channel(self, model: str, channel: str, pointer: dict[str, Any], expected: str | None) -> bool:
        return self.swap_object(layout.channel_path(model, channel), json_bytes(pointer), expected)

    def append_history(self, model: str, channel: str, entry: dict[str, Any]) -> None:
        """Write ``entry`` as a new object ``<history_dir>/<UTC time>-<token>.json``, create-only: two
        writers never overwrite each other, and names sort by time. An entry with an operation id (``op``,
        a promotion or rollback) is written at most once: its token is the op, and an entry of that op
        already there (a retried write whose first answer was lost) is kept, not written again."""
        self.put_history_entry(model, channel, entry)

    def put_history_entry(self, model: str, channel: str, entry: dict[str, Any]) -> tuple[str, bytes]:
        """:meth:`append_history`; returns the object written (its path and bytes), for a mirror (an
        entry of an op already recorded: that object)."""
        data = json.dumps(entry, sort_keys=False, default=str).encode() + b"\n"
        base = layout.history_dir(model, channel)
        op = entry.get("op")
        if isinstance(op, str) and _OP.fullmatch(op):
            tail = f"-{op}.json"
            for rel in self.list_objects(base):  # a retry of this op (after a lost answer) finds its entry
                if rel.endswith(tail):
                    return rel, self.get_object(rel) or data
            rel = f"{base}/{utc_now_us()}{tail}"
            self.put_object(rel, data, create_only=True)  # False: our own earlier attempt made it
            return rel, data
        while True:
            rel = f"{base}/{utc_now_us()}-{secrets.token_hex(4)}.json"
            if self.put_object(rel, data, create_only=True):
                return rel, data  # else a token collision: draw another

    def history(self, model: str, channel: str) -> list[dict[str, Any]]:
        """The channel's entries oldest first, one per operation id (the first; a store written before
        entries were named by their op may hold a retried one twice)."""
        tier = self.shared_tier
        rels = [r for r in tier.list_objects(layout.history_dir(model, channel)) if r.endswith(".json")]
        out, seen = [], set()
        for e in tier._many_json(rels):
            if not isinstance(e, dict):
                continue
            op = e.get("op")
            if isinstance(op, str):
                if op in seen:
                    continue
                seen.add(op)
            out.append(e)
        return out


#: An operation id as :func:`neuron_build.release.channels.new_op` makes it (hex), safe in an object name.
_OP = re.compile(r"[0-9a-f]{8,64}")


__all__ = ["JsonObjects", "parse_object"]
