"""The graph key's compile lock: identical graphs compile once, also under ``doit -n 2`` and across hosts.

A source key's compile runs under the key's lock (:meth:`~neuron_build.store.contract.ArtifactStore.key_lock`:
a file lock on one host, a lease object across hosts). Two targets whose sources differ but whose graphs are
the same (two models differing only in a comment) have two source keys, so those locks do not meet; the graph
key is only known inside the worker, once it has captured the graph. The :class:`GraphGate` gives the graph
key the same lock: while the worker runs, it watches the worker's :data:`~neuron_build.compilers.graph_key.GRAPH_FILE`;
once the worker has its graph key (and the index the builder listed did not hold it), the gate takes the store's
lock of ``graph-<graph key>``, looks the graph key up in the index again, and answers the worker in
:data:`~neuron_build.compilers.graph_key.VERDICT_FILE`: ``{"hit": true}`` (another builder published this graph
while this one waited: the worker stops, the builder reuses and verifies it as for any index hit) or
``{"hit": false}`` (compile). The lock is held until the builder has published and recorded the graph in the
index (:meth:`GraphGate.close`), so the next builder of the same graph finds it there.

Fails closed: whatever goes wrong in the gate (a lock that cannot be taken, an index that cannot be read) answers
"compile". A worker that ends before it asks is not waited for. The wait counts toward the compile's timeout
(``[build] timeout_s``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from neuron_build.compilers import graph_key
from neuron_build.store import graph_index
from neuron_build.util import write_json_atomic

#: Seconds between looks at the worker's graph file.
POLL_S = 0.05
#: The prefix of a graph key's lock name (``locks/graph-<graph key>.lock``, ``leases/graph-<graph key>.json``).
LOCK_PREFIX = "graph-"


class GraphGate:
    """Holds the graph key's lock for one compile attempt (see the module docstring).

    Args:
        store: the builder's store (its ``key_lock`` and graph index are used).
        work: the attempt's work folder (the worker's ``work_dir``: its graph file and the verdict).
        target: the target id (in the lock's owner record). heartbeat_s: seconds between "still waiting" events.
        log: the target's logger.

    Attributes:
        graph_key: the graph key the worker reported (None until then, or when it has none).
        waited_s: seconds spent waiting for the lock. hit: the verdict was "reuse".
    """

    def __init__(self, store: Any, work: Path, target: str, heartbeat_s: float, log: Any):
        self.store, self.work, self.target, self.heartbeat_s, self.log = store, Path(work), target, heartbeat_s, log
        self.graph_key: str | None = None
        self.waited_s = 0.0
        self.hit = False
        self._lock: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def verdict_path(self) -> Path:
        """Where the worker waits for the answer."""
        return self.work / graph_key.VERDICT_FILE

    def start(self) -> GraphGate:
        """Start watching the work folder (in a daemon thread)."""
        self.verdict_path.unlink(missing_ok=True)
        (self.work / graph_key.GRAPH_FILE).unlink(missing_ok=True)
        self._thread = threading.Thread(target=self._run, name=f"graph-gate-{self.target}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        hit = False
        try:
            gk = self._wait_for_key()
            if gk is None:
                return
            self.graph_key = gk
            lock = self.store.key_lock(LOCK_PREFIX + gk, target=self.target, heartbeat_s=self.heartbeat_s)
            lock.acquire(stop=self._stop)
            self._lock = lock
            self.waited_s = lock.waited_s
            entry = graph_index.lookup(self.store, gk)
            hit = entry is not None and self.store.is_complete(entry.key)
            if lock.waited_for is not None:
                self.log.info("waited for the same graph's compile", graph_key=gk[:12], waited_s=round(self.waited_s, 1),
                              reuse=hit)
        except Exception as e:  # fail closed: the worker compiles
            if not self._stop.is_set():
                self.log.warning("no graph lock; compiling", error=f"{type(e).__name__}: {e}")
        self.hit = hit
        if not self._stop.is_set():
            try:
                write_json_atomic(self.verdict_path, {"hit": hit})
            except OSError as e:
                self.log.warning("could not answer the worker", error=str(e))

    def _wait_for_key(self) -> str | None:
        """The graph key the worker wrote, once it asks for a verdict; None when it has none or stopped."""
        path = self.work / graph_key.GRAPH_FILE
        while not self._stop.wait(POLL_S):
            try:
                raw = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(raw, dict):
                return None
            gk = raw.get("graph_key")
            if not raw.get("asks"):
                return None  # no key, or the worker found it in the listed index: it does not wait
            return gk if isinstance(gk, str) and len(gk) == 64 else None
        return None

    def close(self) -> None:
        """Stop watching and release the lock (after the artifact is published and indexed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> GraphGate:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["LOCK_PREFIX", "GraphGate"]
