"""What makes a manifest trusted: its own digest, its key, its fields, PASS; plus the small helpers every
store implementation shares (key names, process liveness, time-sorted names). pydantic is imported only
when a manifest is parsed, never on a no-op build."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from neuron_build.status import Status
from neuron_build.trust import manifest_problem
from neuron_build.util import canonical_json, sha256_hex

if TYPE_CHECKING:
    from neuron_build.store.manifest import Manifest

#: The manifest field holding the sha256 of the manifest's own canonical JSON (without this field).
SELF_DIGEST = "manifest_sha256"


def manifest_digest(raw: dict[str, Any]) -> str:
    """sha256 (64 hex chars) of a manifest's canonical JSON without its :data:`SELF_DIGEST` field."""
    return sha256_hex(canonical_json({k: v for k, v in raw.items() if k != SELF_DIGEST}))


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` running on this host?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_manifest(text: bytes, key: str) -> tuple[Manifest | None, str | None]:
    """Parse and check a manifest's bytes: (manifest, None) or (None, reason). Reasons name the fault: not
    JSON, not an object, a wrong self digest, another key, invalid fields, a non-PASS status, no files."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        return None, f"manifest is not valid JSON ({e})"
    if not isinstance(raw, dict):
        return None, "manifest is not a JSON object"
    if SELF_DIGEST not in raw:
        return None, f"manifest has no {SELF_DIGEST} of its own (not sealed by neuron-build: not trusted)"
    if raw[SELF_DIGEST] != manifest_digest(raw):
        return None, "manifest does not match its own sha256 (edited or corrupt)"
    if (why := manifest_problem(raw)) is not None:  # the trust boundary: names become paths only after it
        return None, f"manifest is refused: {why}"
    if raw.get("key") != key:
        return None, f"manifest names key {str(raw.get('key'))[:16]!r}, not this entry's key"
    from pydantic import ValidationError

    from neuron_build.store.manifest import Manifest

    try:
        man = Manifest.model_validate(raw)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        return None, f"manifest is invalid: {'.'.join(map(str, first['loc']))}: {first['msg']}"
    if man.metrics.status != Status.PASS:
        return None, f"manifest status is {man.metrics.status}, not PASS"
    if not man.files:
        return None, "manifest lists no files"
    return man, None


def utc_now_us() -> str:
    """The current UTC time as ``20261201T094403.123456Z``: history entry names sort by it."""
    import datetime as _dt
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")


__all__ = ["SELF_DIGEST", "check_manifest", "manifest_digest", "pid_alive", "utc_now_us"]
