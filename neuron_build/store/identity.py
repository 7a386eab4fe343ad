"""The identity of a store: a random id written once into the store (``store-id.json``), so that two
hosts can tell whether the location each of them opened is the same store (a folder every worker mounts,
or one bucket), and not two folders that happen to have the same path on different machines."""

from __future__ import annotations

import json
import secrets

from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import STORE_ID_PATH
from neuron_build.util import utc_now


def store_id(store: ObjectIO, create: bool = True) -> str | None:
    """The store's id (32 hex chars), written first (create-only, so concurrent first writers agree) when
    ``create`` and there is none yet.

    Returns:
        the id, or None when the store has none and ``create`` is False.

    Raises:
        OSError: the store could not be read or written (e.g. a read-only store without an id).
        ValueError: the stored identity object is not what this module writes.
    """
    raw = store.get_object(STORE_ID_PATH)
    if raw is None:
        if not create:
            return None
        store.put_object(STORE_ID_PATH, json.dumps({"id": secrets.token_hex(16), "created": utc_now()}).encode(),
                         create_only=True)
        raw = store.get_object(STORE_ID_PATH)
        if raw is None:
            raise OSError(f"{STORE_ID_PATH} vanished right after it was written")
    try:
        ident = json.loads(raw)["id"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{STORE_ID_PATH} in the store is not a store identity ({e})") from e
    return str(ident)


__all__ = ["store_id"]
