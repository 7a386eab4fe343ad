"""The doit glue, nothing else: one ``build:<target id>`` and one ``validate:<target id>`` task per target.

``dodo.py`` is ``from neuron_build.tasks import *``. A task is up to date exactly when the store holds a
complete artifact for the target's current key; the doit database is only an optimisation (delete it
and nothing is rebuilt, because the action itself looks in the store first).

``validate:<target id>`` depends on ``build:<target id>`` and is up to date when the store holds a
validation of the current key on the device kind the artifact runs on, made with the current tolerance
and reference model, that need not be repeated (a pass, or "not validated" on a host that still cannot
run it; a failure is never up to date). Validation imports
torch inside its action only, so ``doit list`` and a no-op ``doit build`` stay torch-free.

The config is ``buckets.toml`` beside ``dodo.py``, or ``doit build config=PATH``, or the
``NEURON_BUILD_CONFIG`` environment variable.
"""

from __future__ import annotations

import os
import sys

from doit import get_var
from doit.exceptions import TaskFailed

from .build import Builder
from .config import load_project
from .errors import ConfigError
from .log import configure
from .validate import artifact_device_kind, is_validated, tolerance_for

DOIT_CONFIG = {
    "default_tasks": ["build"],
    "continue": True,          # one failed target never stops the others
    "backend": "sqlite3",      # transactional, and a second process is not locked out
    "dep_file": ".doit.db",
    "verbosity": 2,
}

_builder: Builder | None = None


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
        _builder = Builder(project)
        if _builder.keys.backend_note:
            from .log import get_logger
            get_logger().info(_builder.keys.backend_note)
    return _builder


def _is_built(key: str) -> bool:
    return builder().store.is_complete(key)


def _build(target_id: str):
    b = builder()
    out = b.build(b.by_id[target_id])
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
    from .errors import UserError
    from .validate import summary_line, validate_target

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
