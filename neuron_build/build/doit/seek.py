"""``doit build`` in a subfolder of a neuron-build project, or beside a ``buckets.toml`` without ``dodo.py``:
one line and exit 2, not doit's exit 3.

doit looks for ``dodo.py`` in the current folder only (``--seek-file`` searches the parents); without it,
doit says "Could not find dodo file" and exits 3, which in neuron-build's table means a gate refused a
promotion. :class:`Run` is doit's own ``run`` command (doit's ``run`` plugin, registered under the
``doit.COMMAND`` entry point in pyproject.toml) that, only when a parent folder holds a neuron-build
project (``dodo.py`` beside ``buckets.toml``), or this folder or a parent holds ``buckets.toml`` without
``dodo.py``, says where it is and what to run instead, and exits 2
(:class:`~neuron_build.errors.ExitCode`). Everywhere else it is doit's ``run`` unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from doit.cmd_run import Run as _DoitRun
from doit.exceptions import InvalidDodoFile

from neuron_build.errors import ExitCode


def project_above(folder: Path) -> Path | None:
    """The nearest parent of ``folder`` that holds a neuron-build project (``dodo.py`` and ``buckets.toml``)."""
    for p in folder.resolve().parents:
        if (p / "dodo.py").is_file() and (p / "buckets.toml").is_file():
            return p
    return None


def seek_hint(folder: Path) -> str | None:
    """The one line for ``doit`` run in ``folder`` below a neuron-build project, or in (or below) a folder
    holding ``buckets.toml`` but no ``dodo.py``; None elsewhere (doit's own error stays)."""
    root = project_above(folder)
    if root is None:
        here = folder.resolve()
        config = next((p for p in (here, *here.parents) if (p / "buckets.toml").is_file()), None)
        if config is None:
            return None
        return (f"no dodo.py in {config} beside buckets.toml: run `neuron-build build`, or write a dodo.py holding "
                f"`from neuron_build.tasks import *` (what `neuron-build init` writes) to build with doit")
    return (f"no dodo.py in {folder.resolve()}; the project is {root}: run `doit --seek-file build` (doit "
            f"searches the parent folders) or `neuron-build build` (it finds buckets.toml the same way)")


class Run(_DoitRun):
    """doit's ``run`` command; a missing ``dodo.py`` below a neuron-build project is a usage error (exit 2)."""

    name = "run"

    def execute(self, params: Any, args: list[str]) -> int:
        """doit's ``run``; returns 2 with one line on stderr when ``dodo.py`` is in a parent folder."""
        try:
            return super().execute(params, args)
        except InvalidDodoFile as e:
            hint = seek_hint(Path.cwd()) if str(e).startswith("Could not find dodo file") else None
            if hint is None:
                raise
            print(f"ERROR: {hint}", file=sys.stderr)
            return int(ExitCode.USAGE)


__all__ = ["Run", "project_above", "seek_hint"]
