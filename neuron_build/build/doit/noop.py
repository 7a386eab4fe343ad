"""The no-op path of a build: the plan cache read back (:func:`cached_plan`) and written for the next no-op
(:func:`save_plan`), and the check that an artifact still matches the inputs its build recorded
(:class:`Recorded`). What :class:`~neuron_build.build.doit.session.BuildSession` asks before any task runs; cheap:
no config parsed, no key computed when nothing the keys read changed (:mod:`neuron_build.project.plan_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_build.store.layout import manifest_path

if TYPE_CHECKING:  # the config schema and the keys load when a plan is computed, not on a no-op
    from neuron_build.project.plan_cache import Plan
    from neuron_build.workspace import Workspace

__all__ = ["RECORDED_CACHE", "Recorded", "cached_plan", "save_plan"]

#: The file in the project's state folder where :class:`Recorded` remembers each manifest's record.
RECORDED_CACHE = "recorded.json"

def cached_plan(config_path: str) -> tuple[Plan, Any] | None:
    """The plan cache's targets and keys for the ``buckets.toml`` at ``config_path`` and the local store they are
    checked against, when every input of the cached plan is unchanged (see
    :mod:`neuron_build.project.plan_cache`); None otherwise (then the build plans as usual). The recorded
    inputs of each artifact are not part of the plan: every task's check compares them (:class:`Recorded`)."""
    from neuron_build.errors import ConfigError
    from neuron_build.project import plan_cache
    from neuron_build.project.config_file import state_dir_setting
    from neuron_build.store.local import LocalStore

    p = Path(config_path)
    try:
        data = p.read_bytes()
        resolved = p.resolve()
    except OSError:
        return None  # the planning path says what is wrong
    try:  # the config's own reader: the TOML is parsed only when it names state_dir
        state = state_dir_setting(str(p), data)
    except ConfigError:
        return None
    if state is None:
        return None
    plan, _ = plan_cache.load(resolved.parent / state, resolved, data)
    if plan is None:
        return None
    try:
        store = LocalStore(Path(plan.store))
    except (OSError, ValueError):
        return None
    return plan, store


def save_plan(ws: Workspace, interp: dict[str, Any]) -> None:
    """Write the plan cache of ``ws``'s plan (best effort) when a later no-op may use it: a local store
    without a remote, the local executor (else the no-op path has more to do than check the store)."""
    from neuron_build.project import plan_cache
    from neuron_build.project.keys import KEY_ENV
    p = ws.project
    if (ws.store.folder is None or ws.store.remote_location is not None or p.remote_url() is not None or p.config.build.executor != "local"
            or not p.config_sha256):
        return
    plan_cache.write(p.state_dir, config_path=p.path, config_sha256=p.config_sha256, log=ws.keys.inputs,
                     env_names=[n for names in KEY_ENV.values() for n in names] + _declared_env_names(p),
                     store=str(ws.store.folder), backend=ws.keys.backend, hardware_target=ws.keys.hardware_target,
                     targets=[(t.id, ws.key(t).key) for t in ws.targets], interp=interp)


def _declared_env_names(project: Any) -> list[str]:
    """The variables the models declare (``env = [...]``: in their keys), and ``HOME`` when an
    ``inputs_from`` glob starts with ``~`` (the folder it names)."""
    models = project.config.models.values()
    home = any(g.startswith("~") for m in models for g in m.inputs_from)
    return sorted({n for m in models for n in m.env} | ({"HOME"} if home else set()))


class Recorded:
    """Does the artifact a store holds for a key still match the inputs its build recorded (the manifest's
    ``recorded_inputs``: files read by any code, variables, distributions)? The no-op's second check,
    after :meth:`~neuron_build.store.local.LocalStore.is_cached`. Cheap on the no-op path: each manifest's
    record is remembered (``<state_dir>/recorded.json``) with the manifest file's stat signature (size,
    mtime_ns, ctime_ns, inode: a replaced manifest has another), so an unchanged manifest is not read; equal
    records share one verdict; file digests come from the digest cache (a file whose stat signature is
    unchanged is not read).

    Args:
        store: the store whose manifests are read (its local folder's files are stat()ed).
        check: the project's :class:`~neuron_build.project.reads.InputCheck`.
        save: called once the run is over (persists the digest cache), or None.
        cache: the file that remembers the records (None: none).
    """

    def __init__(self, store: Any, check: Any, save: Any = None, cache: Path | None = None):
        self.store, self.check, self._save, self._cache = store, check, save, cache
        folder = store.folder
        self._root = str(folder) if folder is not None else None
        self._entries: dict[str, list] = {}  # key -> [manifest signature, record digest]
        self._records: dict[str, Any] = {}  # record digest -> record
        self._dirty = False
        if cache is not None:
            try:
                doc = json.loads(cache.read_bytes())
                if isinstance(doc.get("entries"), dict) and isinstance(doc.get("records"), dict):
                    self._entries, self._records = doc["entries"], doc["records"]
            except (OSError, ValueError, AttributeError):
                pass

    def __call__(self, key: str) -> bool:
        got = self._record(key)
        return got is not None and not self.check.stale(got[0], memo=got[1])

    def _record(self, key: str) -> tuple[Any, str] | None:
        """(the manifest's ``recorded_inputs``, its digest), or None when there is no manifest."""
        sig = None
        if self._root is not None:
            try:
                st = os.stat(f"{self._root}/{manifest_path(key)}")
                sig = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
            except OSError:
                sig = None
            ent = self._entries.get(key)
            if sig is not None and isinstance(ent, list) and len(ent) == 2 and ent[0] == sig \
                    and ent[1] in self._records:
                return self._records[ent[1]], ent[1]
        raw = self.store.raw_manifest(key)
        if not isinstance(raw, dict):
            return None
        rec = raw.get("recorded_inputs")
        digest = hashlib.sha256(json.dumps(rec, sort_keys=True, default=str).encode()).hexdigest()
        if sig is not None:
            self._records[digest] = rec
            self._entries[key] = [sig, digest]
            self._dirty = True
        return rec, digest

    def save(self) -> None:
        """Persist the digest cache and the remembered records (best effort: only an accelerator)."""
        if self._save is not None:
            self._save()
        if self._dirty and self._cache is not None:
            from neuron_build.util import write_atomic
            live = {d for _, d in self._entries.values()}
            doc = {"entries": self._entries, "records": {d: r for d, r in self._records.items() if d in live}}
            write_atomic(self._cache, json.dumps(doc, separators=(",", ":")).encode())
            self._dirty = False

    @classmethod
    def of_plan(cls, plan: Plan, store: Any) -> Recorded:
        """The check of a cached plan's project (no config parsed: its folder and state folder are the
        plan's)."""
        from neuron_build.project.digest_cache import DigestCache
        from neuron_build.project.read_check import InputCheck

        digests = DigestCache(Path(plan.state_dir) / "digests.json")
        return cls(store, InputCheck(Path(plan.root), os.environ, digests.digest), digests.save,
                   Path(plan.state_dir) / RECORDED_CACHE)
