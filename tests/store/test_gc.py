"""gc beside a live builder: a publisher that reuses a blob an old, unreferenced artifact left behind races
the collector, many times. Every current artifact must stay complete (the publisher touches the blob it
finds present and checks its blobs again after its commit; gc moves a planned blob aside, looks again,
and puts back what a new manifest lists or what was touched since its plan)."""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os
import random
import threading
import time
from pathlib import Path

import pytest

from neuron_build.store import LocalStore
from neuron_build.store.gc import collect_garbage
from neuron_build.store.remote import RemoteStore
from tests.helpers.store import manifest

#: Races per store kind.
ROUNDS = 30
OLD = "0f" * 32
SHARED = b"weights of the model " * 2000


def _stage(store, key: str, files: dict[str, bytes], created: str) -> Path:
    folder = store.new_staging(key) / "object"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    store.seal(folder, manifest(key, files).model_copy(update={"created": created}))
    return folder


def _age_tree(root: Path, days: float) -> None:
    t = time.time() - days * 86400
    for d, _, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(d, f), (t, t))


def _race(kind: str, root: Path, i: int) -> bool:
    """One round; True when the new current artifact is complete afterwards."""
    if kind == "folder":
        store = LocalStore(root / "store")
        folder_of_store, gc = store.root, collect_garbage
    else:
        store = RemoteStore(f"file://{root}/shared", cache_dir=root / "cache")
        folder_of_store, gc = root / "shared", functools.partial(collect_garbage, current_targets=())
    long_ago = (_dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=10)).isoformat()
    store.publish(_stage(store, OLD, {"model.pt": SHARED}, long_ago), OLD)
    _age_tree(folder_of_store, 10)  # the old artifact and its blob are well outside the window
    new = hashlib.sha256(f"round {i}".encode()).hexdigest()
    folder = _stage(store, new, {"model.pt": SHARED, "config.json": f"{{\"round\": {i}}}".encode()},
                    _dt.datetime.now(_dt.timezone.utc).isoformat())
    t0 = time.perf_counter()
    gc(store, keep_keys=[new], keep_days=1, dry_run=True)  # how long a plan takes: the race's window
    window = time.perf_counter() - t0
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    failed: list[BaseException] = []

    def publisher() -> None:
        try:
            start.wait()
            time.sleep(random.uniform(0, 1.5 * window))
            store.publish(folder, new)
        except Exception as e:  # a publish that fails beside gc is a broken current artifact too
            failed.append(e)

    def collector() -> None:
        try:
            start.wait()
            gc(store, keep_keys=[new], keep_days=1)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=publisher), threading.Thread(target=collector)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert store.raw_manifest(OLD) is None  # gc did collect the old artifact in every round
    return not failed and store.lookup(new, deep=True).hit


@pytest.mark.parametrize("kind", ["folder", "file-url"])
def test_gc_beside_a_publisher_reusing_a_blob_keeps_every_current_artifact_complete(kind, tmp_path, capsys):
    random.seed(20)
    broken = [i for i in range(ROUNDS) if not _race(kind, tmp_path / str(i), i)]
    with capsys.disabled():
        print(f"\ngc race ({kind}): {ROUNDS} rounds, {len(broken)} current artifacts broken")
    assert broken == []
