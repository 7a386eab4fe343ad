"""What every ``neuron-build`` command shares: the command registry, opening the project, and output.

A command module under :mod:`neuron_build.cli` defines ``register(add)`` (``add(name, help)`` returns an
argparse sub-parser) and decorates each handler with :func:`command`. A handler takes the parsed
arguments and returns an exit status (:class:`neuron_build.errors.ExitCode`); an error it raises is
printed and mapped to a status by ``main`` (:func:`neuron_build.errors.exit_code`). Handlers are thin:
parse the arguments, call one domain verb, print one result (and the next step). Keep command modules
free of torch imports (``import neuron_build.cli`` must stay torch-free).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuron_build.build.builder import Builder
    from neuron_build.project.config import Project
    from neuron_build.store.contract import ArtifactStore

#: A command handler: parsed arguments -> exit status.
Handler = Callable[[argparse.Namespace], int]

#: Command name -> handler, filled by :func:`command` as the command modules are imported.
COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of the sub-command ``name``."""
    def deco(fn: Handler) -> Handler:
        COMMANDS[name] = fn
        return fn
    return deco


# -- opening the project --------------------------------------------------------------------------------
def open_project(args: argparse.Namespace) -> Project:
    """The project of ``args.config`` (None: ``buckets.toml`` found from the current folder).

    Raises:
        ConfigError: the config is missing or invalid (exit 2).
    """
    from neuron_build.project.config import load_project

    return load_project(args.config)


def open_builder(args: argparse.Namespace, *, backend: str | None = None, quiet: bool | None = None) -> Builder:
    """Load the project, send the log to its ``build.log`` and return a :class:`Builder` over it.

    Args:
        args: parsed arguments (``config``; ``json`` when the command has ``--json``).
        backend: build the keys of this backend instead of the project's ``[build] backend``.
        quiet: only warnings and errors on stderr; default: when ``--json`` was given.

    Raises:
        ConfigError: the config is missing or invalid (exit 2).
    """
    from neuron_build.build.builder import Builder
    from neuron_build.log import configure

    project = open_project(args)
    configure(project.state_dir / "build.log", quiet=getattr(args, "json", False) if quiet is None else quiet)
    return Builder(project, backend=backend)


def open_project_store(args: argparse.Namespace) -> tuple[Project, ArtifactStore]:
    """The project of ``args.config`` and its store, for commands that need no Builder (and no log).

    Raises:
        ConfigError: the config is missing or invalid (exit 2).
    """
    from neuron_build.store import cached_store

    project = open_project(args)
    return project, cached_store(project.store_url(), project.remote_url(), project.config.build.remote_options)


# -- output ---------------------------------------------------------------------------------------------
def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout (objects JSON cannot hold as their ``str()``)."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def display_line(text: str) -> None:
    """Print one line of a long command's progress on stdout, at once (not when the command ends)."""
    print(text, flush=True)


def display_note(text: str) -> None:
    """Print one progress or status line on stderr (kept off stdout, which may carry ``--json``)."""
    print(text, file=sys.stderr, flush=True)


def display_error(text: str, prefix: str = "error") -> None:
    """Print ``<prefix>: <text>`` on stderr: the one message of a command that failed."""
    print(f"{prefix}: {text}", file=sys.stderr)


def plural(n: int, word: str) -> str:
    """``"1 target"``, ``"2 targets"``."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def mib(n: int) -> str:
    """A byte count as ``"12.3 MiB"``."""
    return f"{n / 2**20:.1f} MiB"


__all__ = ["COMMANDS", "Handler", "command", "display_error", "display_line", "display_note", "mib", "open_builder",
           "open_project", "open_project_store", "plural", "print_json"]
