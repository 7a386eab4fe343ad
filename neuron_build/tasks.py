"""The doit glue, nothing else: one ``build:<target id>`` task per target.

``dodo.py`` is ``from neuron_build.tasks import *``. A task is up to date exactly when the store holds a
complete artifact for the target's current key; the doit database is only an optimisation (delete it
and nothing is rebuilt, because the action itself looks in the store first).

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
        _builder = Builder(project)  # logs the `auto` fallback note, once per process
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
