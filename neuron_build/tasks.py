"""The doit glue, nothing else: one ``build:<target id>`` and one ``validate:<target id>`` task per target.

``dodo.py`` is ``from neuron_build.tasks import *``. A task is up to date exactly when the store holds a
complete artifact for the target's current key, so doit's database holds nothing a build needs: it is
kept in memory, one per process (``dep_file = ":memory:"``). A database file shared by two ``doit build``
processes is not safe: doit's sqlite3 backend keeps a write transaction open from a task's first failure
until the end of the run, and a second process that finishes meanwhile dies with "database is locked"
(seen with doit 0.37; tests/faults/test_concurrency.py runs both). Without a file, ``doit forget`` and
``doit ignore`` have nothing to remember; every other command works as before.

``validate:<target id>`` depends on ``build:<target id>`` and is up to date when the store holds a
validation of the current key on the device kind the artifact runs on, made with the current tolerance
and reference model, that need not be repeated (a pass, or "not validated" on a host that still cannot
run it; a failure is never up to date). Validation imports
torch inside its action only, so ``doit list`` and a no-op ``doit build`` stay torch-free.

The config is ``buckets.toml`` beside ``dodo.py``, or ``doit build config=PATH``, or the
``NEURON_BUILD_CONFIG`` environment variable. ``doit build retry_failed=0`` skips targets whose current
key failed last time (``neuron-build build --no-retry-failed``); by default every build retries them.
"""

from __future__ import annotations

import os
import sys

from doit import get_var
from doit.exceptions import TaskFailed

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.errors import ConfigError
from neuron_build.log import configure
from neuron_build.evaluate.validate import artifact_device_kind, is_validated, tolerance_for

DOIT_CONFIG = {
    "default_tasks": ["build"],
    "continue": True,          # one failed target never stops the others
    "backend": "sqlite3",
    "dep_file": ":memory:",    # per process: concurrent builds never share (or lock) a database
    "verbosity": 2,
}

_builder: Builder | None = None
#: target id -> the Outcome of its build in this process (read by ``neuron-build build`` for its summary)
OUTCOMES: dict = {}


def builder() -> Builder:
    """The process's :class:`Builder`, made on first use from the configured ``buckets.toml``.

    A config error is printed as one message and exits with status 2.
    """
    global _builder
    if _builder is None:
        path = get_var("config", os.environ.get("NEURON_BUILD_CONFIG", "buckets.toml"))
        try:
            project = load_project(path)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        configure(project.state_dir / "build.log")
        _builder = Builder(project)  # logs the `auto` fallback note, once per process
    return _builder


def _is_built(key: str) -> bool:
    return builder().store.is_complete(key)


_MAIN_PID = os.getpid()
_pdeathsig_set = False


def _die_with_parent() -> None:
    """In a runner process forked by ``doit -P process``, ask Linux to SIGKILL it when doit dies, so a
    killed build leaves no orphan builder behind (its compile workers die with it the same way)."""
    global _pdeathsig_set
    if _pdeathsig_set or os.getpid() == _MAIN_PID:
        return
    from neuron_build.build.builder import _set_pdeathsig
    _set_pdeathsig()
    _pdeathsig_set = True


def _retry_failed() -> bool:
    v = get_var("retry_failed", "1")
    return v is None or str(v).strip().lower() not in ("0", "false", "no", "off")


def _build(target_id: str):
    b = builder()
    _die_with_parent()
    out = b.build(b.by_id[target_id], retry_failed=_retry_failed())
    OUTCOMES[target_id] = out
    if not out.ok:
        return TaskFailed(f"{target_id}: {out.status}: {out.reason}")
    return {"key": out.key, "status": out.status}


def task_build():
    """Compile every target of the matrix that the store does not hold yet."""
    b = builder()
    b.store.clean_staging()
    for t in b.targets:
        key = b.key(t).key
        yield {
            "name": t.id,
            "doc": f"compile {t.id} ({b.keys.backend}, {b.keys.hardware_target})",
            "actions": [(_build, [t.id])],
            "uptodate": [(_is_built, [key])],
        }
    b.keys.save()


def _is_validated(key: str, device_kind: str, tolerance: float, reference: str) -> bool:
    return is_validated(builder().store, key, device_kind, tolerance, reference)


def _validate(target_id: str):
    from neuron_build.errors import UserError
    from neuron_build.evaluate.validate import summary_line, validate_target

    b = builder()
    t = b.by_id[target_id]
    try:
        rec = validate_target(b.project, b.store, t, b.key(t).key)
    except UserError as e:
        return TaskFailed(str(e))
    print(summary_line(rec))
    for note in rec.get("diagnosis", []):
        print(f"    {note}")
    if rec["verdict"] == "fail":
        return TaskFailed(rec["reason"])
    return {"key": rec["key"], "verdict": rec["verdict"]}


def task_validate():
    """Check every target's artifact against the eager fp32 CPU reference (builds it first)."""
    b = builder()
    kind = artifact_device_kind(b.keys.backend, b.keys.hardware_target)
    for t in b.targets:
        key = b.key(t).key
        spec = b.project.config.models[t.model]
        tol, _ = tolerance_for(spec, t.model, t.dtype)
        yield {
            "name": t.id,
            "doc": f"validate {t.id} on {kind} against the fp32 CPU reference",
            "actions": [(_validate, [t.id])],
            "task_dep": [f"build:{t.id}"],
            "uptodate": [(_is_validated, [key, kind, tol, spec.reference or t.model])],
            "verbosity": 2,
        }
