"""The build ledger: one immutable record per compile attempt, cache hit and reuse, in any store.

Each compile attempt and each hit or reuse the builder sees is its own object at ``ledger/<yyyy-mm-dd>/<HHMMSS.ffffff>Z-<host>-<token>.json``
(:func:`neuron_build.store.layout.ledger_path`), written create-only through the store's
:class:`~neuron_build.store.contract.ObjectIO`: concurrent builders on one host or many, on a shared
folder or a remote store, never overwrite each other, so no record is lost and a shared store holds a
team-wide history. Records are never edited. Reading the ledger needs only the store (no project, no
models, no torch): ``neuron-build report`` and ``metrics`` work on a store alone. The targets a doit
build finds up to date (its ``uptodate`` check: no builder call) are written at the end of the build as
one object listing their ``cached`` records (:func:`append_batch`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from neuron_build.status import Status
from neuron_build.store.contract import ObjectIO
from neuron_build.store.layout import LEDGER_DIR, ledger_path

#: The version of a ledger record's JSON (bumped when a field changes meaning).
SCHEMA = 1
#: What a record is about: a compile attempt (``compile``), a cache hit (``cached``: the store held the
#: artifact before any lock), a reuse (``reused``: another builder compiled the key while this one waited), or
#: a download (``downloaded``: only the read-through store's remote held it), or a graph reuse
#: (``graph-reused``: the source key missed, the graph key hit: the key was published over the blobs of
#: ``reused_from``, nothing compiled).
EVENTS = ("compile", "cached", "reused", "downloaded", "graph-reused")
_WINDOW = re.compile(r"^\s*-?\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")  # "-3h" reads as "3h": 3 hours ago
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True)
class LedgerRecord:
    """One ledger entry.

    Attributes:
        target: the target id (``minilm/b8-s128/bf16/o2``: model, bucket, dtype, profile).
        key: the artifact key (64 hex chars).
        event: one of :data:`EVENTS`.
        status: the attempt's :class:`~neuron_build.status.Status` (``PASS`` for a hit or a reuse).
        time: when it happened (ISO 8601, UTC).
        host: the builder's host name; executor: what ran the compile (``LocalExecutor``, ...).
        backend: the compiler backend (``neuron``, ``inductor``, ``torchscript``).
        attempt: the attempt's number within one build (transient retries count up; 0 for a hit).
        failure_stage: where a failed compile stopped: ``model`` (the factory or the example inputs),
            ``export``, ``compile``, ``save``, ``count`` (the worker's last stage line), or
            ``neuronx-cc`` for the Neuron compiler; None for PASS or when unknown.
        compiler_pass: the last neuronx-cc pass the compiler log shows finished, when it shows passes.
        diagnostic_code: the first error diagnostic code of the compiler log (``XCG815``, ``NCC_EOOM001``).
        reason: the failure's one-line reason ("" for PASS).
        compile_time_s: wall time of the compile subprocess, seconds (None for a hit or a reuse).
        peak_rss_bytes: peak resident memory of the compile's process tree, bytes (None for a hit).
        hbm_peak_bytes: peak HBM as the compiler log estimates it (``Estimated peak HBM usage (X)``), bytes;
            None when the log gives none.
        op_count: kernels the artifact launches (None for a failed compile).
        artifact_bytes: total size of the artifact's files, bytes (None for a failed compile).
        changed: the key components that changed since the last build of the target (``["shapes"]``);
            ``["new target"]`` for a target never built; empty when the key did not change.
        workdir: the kept failure workdir (``failures/<target id>/<entry>``), when one was kept.
        reused_from: for ``graph-reused``, the key whose artifact (same graph) the target now shares.
        graph_key: the graph key of a compile or a graph reuse, when the backend made one.
    """

    target: str
    key: str
    event: str
    status: str
    time: str
    host: str = ""
    executor: str = ""
    backend: str = ""
    attempt: int = 0
    failure_stage: str | None = None
    compiler_pass: str | None = None
    diagnostic_code: str | None = None
    reason: str = ""
    compile_time_s: float | None = None
    peak_rss_bytes: int | None = None
    hbm_peak_bytes: int | None = None
    op_count: int | None = None
    artifact_bytes: int | None = None
    changed: tuple[str, ...] = field(default_factory=tuple)
    workdir: str | None = None
    reused_from: str | None = None
    graph_key: str | None = None

    # -- the target id's parts --------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self.target.split("/")[0]

    @property
    def group(self) -> str:
        """``model/dtype/profile/backend``: the targets one release would hold (every bucket of one dtype,
        profile and backend), the unit of the artifacts-per-model signal."""
        parts = self.target.split("/")
        dtype, profile = (parts[2], parts[3]) if len(parts) == 4 else ("", "")
        return f"{parts[0]}/{dtype}/{profile}/{self.backend}"

    @property
    def bucket(self) -> str:
        parts = self.target.split("/")
        return parts[1] if len(parts) == 4 else ""

    @property
    def ok(self) -> bool:
        """True for PASS (a compile that passed, a hit, a reuse)."""
        return self.status == Status.PASS

    @property
    def is_compile(self) -> bool:
        return self.event == "compile"

    @property
    def is_recompile(self) -> bool:
        """A compile of a target built before under another key (its key components changed)."""
        return self.is_compile and bool(self.changed) and list(self.changed) != ["new target"]

    @property
    def when(self) -> _dt.datetime:
        """:attr:`time` as an aware UTC datetime (the epoch when it does not parse)."""
        return parse_time(self.time)

    def to_json(self) -> dict[str, Any]:
        # every field is a scalar but ``changed``: no deep copy (``asdict``) needed, 1,000 of these per no-op
        out = {"schema": SCHEMA, **{name: getattr(self, name) for name in self.__dataclass_fields__}}
        out["changed"] = list(self.changed)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> LedgerRecord | None:
        """The record in ``raw``, or None when it is not one (no string ``target``, ``key``, ``event``,
        ``status`` and ``time``): an unreadable record is skipped, never a crash."""
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), str)
                                                for k in ("target", "key", "event", "status", "time")):
            return None
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in raw.items() if k in names}
        changed = kw.get("changed")
        kw["changed"] = tuple(str(c) for c in changed) if isinstance(changed, list) else ()
        for k in ("compile_time_s",):
            if not isinstance(kw.get(k), (int, float)) or isinstance(kw.get(k), bool):
                kw[k] = None
        for k in ("peak_rss_bytes", "hbm_peak_bytes", "op_count", "artifact_bytes"):
            if not isinstance(kw.get(k), int) or isinstance(kw.get(k), bool):
                kw[k] = None
        if not isinstance(kw.get("attempt"), int):
            kw["attempt"] = 0
        for k in ("host", "executor", "backend", "reason"):
            kw[k] = str(kw.get(k) or "")
        for k in ("failure_stage", "compiler_pass", "diagnostic_code", "workdir", "reused_from", "graph_key"):
            kw[k] = str(kw[k]) if kw.get(k) is not None else None
        return cls(**kw)


def parse_time(iso: str) -> _dt.datetime:
    """An ISO 8601 time as an aware UTC datetime; a naive one is taken as UTC; the epoch when it does not
    parse."""
    try:
        t = _dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def parse_window(text: str) -> _dt.timedelta:
    """A window such as ``24h``, ``90m``, ``7d``, ``30s``, ``2w`` as a timedelta (how far back it reaches; a
    leading ``-``, as in ``-3h``, means the same: 3 hours ago).

    Raises:
        ValueError: not a number followed by one of s, m, h, d, w (the message names the value and the forms),
            or a window reaching back before year 1.
    """
    m = _WINDOW.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--since {text!r} is not a window: give a positive number and a unit (s, m, h, d, w), "
                         f"e.g. 24h, 90m, 7d (-3h is read as 3h: 3 hours ago), or 'all'")
    try:
        delta = _dt.timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])
        _dt.datetime.now(_dt.timezone.utc) - delta  # a window reaching back before year 1 cannot be a date
    except OverflowError:
        raise ValueError(f"--since {text!r} reaches back further than dates go (before year 1): give a shorter "
                         f"window, e.g. 24h, 7d, or 'all' for every record") from None
    return delta


def record_path(rec: LedgerRecord, host: str | None = None, token: str | None = None) -> str:
    """Where ``rec`` goes: ``ledger/<yyyy-mm-dd>/<HHMMSS.ffffff>Z-<host>-<token>.json`` from its time (UTC),
    the writer's host (characters outside ``[A-Za-z0-9.-]`` become ``_``) and 8 random hex digits."""
    t = rec.when.astimezone(_dt.timezone.utc)
    safe = re.sub(r"[^A-Za-z0-9.-]", "_", host or rec.host or socket.gethostname())[:64]
    return ledger_path(t.strftime("%Y-%m-%d"), f"{t.strftime('%H%M%S.%f')}Z-{safe}-{token or secrets.token_hex(4)}")


def append(store: ObjectIO, rec: LedgerRecord) -> str:
    """Add ``rec`` to the ledger of ``store`` as a new object, create-only (a name taken by another writer
    is never replaced: a fresh token is drawn).

    Returns:
        The record's path in the store.

    Raises:
        OSError: the store could not be written (e.g. ENOSPC); nothing half-written is left.
    """
    data = (json.dumps(rec.to_json(), sort_keys=True) + "\n").encode()
    for _ in range(8):
        path = record_path(rec)
        if store.put_object(path, data, create_only=True):
            return path
    raise OSError(f"could not find a free ledger name for {rec.target} after 8 tries")  # pragma: no cover


def append_cache_hits(store: ObjectIO, hits: Iterable[tuple[str, str]], executor: str, backend: str) -> str | None:
    """Add one ``cached`` record (status PASS, attempt 0) per (target id, key) of ``hits`` as one ledger
    object (:func:`append_batch`), stamped now and with this host; a target listed twice counts once.

    Raises:
        OSError: the store could not be written.
    """
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")
    host = socket.gethostname()
    recs = [LedgerRecord(target=tid, key=key, event="cached", status=Status.PASS, time=now, host=host,
                         executor=executor, backend=backend) for tid, key in dict(hits).items()]
    return append_batch(store, recs)


def append_batch(store: ObjectIO, records: list[LedgerRecord]) -> str | None:
    """Add ``records`` (e.g. the cache hits of one no-op build) to the ledger as one new object,
    ``{"schema": 1, "records": [...]}``, named after the first record; None when there are none. A no-op
    build of 1,000 targets writes one object, not 1,000.

    Raises:
        OSError: the store could not be written; nothing half-written is left.
    """
    if not records:
        return None
    data = (json.dumps({"schema": SCHEMA, "records": [r.to_json() for r in records]}, sort_keys=True) + "\n").encode()
    for _ in range(8):
        path = record_path(records[0])
        if store.put_object(path, data, create_only=True):
            return path
    raise OSError("could not find a free ledger name after 8 tries")  # pragma: no cover


def read(store: ObjectIO, since: _dt.datetime | None = None, until: _dt.datetime | None = None,
         skipped: list[str] | None = None) -> list[LedgerRecord]:
    """The ledger records of ``store`` with ``since <= time <= until`` (both optional, aware datetimes),
    oldest first (ties by target). Day folders outside the window are not read; unreadable records are
    skipped, each added to ``skipped`` (when given) as ``"<path> (not JSON)"`` or ``"<path>#<index in its
    batch> (not a ledger record)"``."""
    day_from = since.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d") if since else None
    day_to = until.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d") if until else None
    out: list[LedgerRecord] = []
    for path in store.list_objects(LEDGER_DIR):
        parts = path.split("/")
        if len(parts) != 3 or not parts[2].endswith(".json"):
            continue
        day = parts[1]
        if (day_from and day < day_from) or (day_to and day > day_to):
            continue
        data = store.get_object(path)
        if data is None:
            continue
        try:
            raw = json.loads(data)
        except ValueError:
            if skipped is not None:
                skipped.append(f"{path} (not JSON)")
            continue
        many = isinstance(raw, dict) and isinstance(raw.get("records"), list)
        batch = raw["records"] if many else [raw]
        for i, item in enumerate(batch):
            rec = LedgerRecord.from_json(item)
            if rec is None:
                if skipped is not None:
                    skipped.append(f"{path}#{i} (not a ledger record)" if many else f"{path} (not a ledger record)")
                continue
            when = rec.when
            if (since and when < since) or (until and when > until):
                continue
            out.append(rec)
    out.sort(key=lambda r: (r.when, r.target))
    return out


def latest_by_target(records: Iterable[LedgerRecord]) -> dict[str, LedgerRecord]:
    """The newest record of each target among ``records`` (oldest-first input), by target id."""
    out: dict[str, LedgerRecord] = {}
    for r in records:
        out[r.target] = r
    return dict(sorted(out.items()))


__all__ = ["EVENTS", "SCHEMA", "LedgerRecord", "append", "append_batch", "append_cache_hits", "latest_by_target", "parse_time", "parse_window", "read",
           "record_path"]
