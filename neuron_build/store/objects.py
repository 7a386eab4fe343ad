"""What a store implements the same way whatever it is made of: the records and manifests that are whole
small JSON objects, written and read through its :class:`~neuron_build.store.contract.ObjectIO`
primitives. :class:`~neuron_build.store.local.LocalStore` and :class:`~neuron_build.store.remote.RemoteStore`
both take these from :class:`JsonObjects` and keep only what their medium changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from neuron_build.store import layout
from neuron_build.store.records import TargetRecord
from neuron_build.util import canonical_json


def parse_object(data: bytes | None) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object, or None when absent, not JSON, or not an object."""
    if data is None:
        return None
    try:
        raw = json.loads(data)
    except ValueError:
        return None
    return raw if isinstance(raw, dict) else None


class JsonObjects:
    """Manifests, target records and recorded imports over ``get_object`` / ``put_object`` and
    ``_records(name, model, bucket_id)`` (the implementation's listing of ``targets/``: (target id, raw
    JSON) pairs in target-id order)."""

    def get_object(self, path: str) -> bytes | None:  # provided by the implementation
        raise NotImplementedError

    def put_object(self, path: str, data: bytes, create_only: bool = False) -> bool:  # provided likewise
        raise NotImplementedError

    def _records(self, name: str, model: str | None, bucket_id: str | None) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError

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


__all__ = ["JsonObjects", "parse_object"]
