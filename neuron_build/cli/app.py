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
    from neuron_build.project.config import Project
    from neuron_build.store.contract import ArtifactStore
    from neuron_build.workspace import Workspace

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


def open_workspace(args: argparse.Namespace, *, backend: str | None = None, quiet: bool | None = None) -> Workspace:
    """Load the project, send the log to its ``build.log`` and open it against its store: a
    :class:`~neuron_build.workspace.Workspace` (keys, states, what changed; no executor, memory budget or
    recorder: a read command never constructs a Builder).

    Args:
        args: parsed arguments (``config``; ``json`` when the command has ``--json``).
        backend: the keys of this backend instead of the project's ``[build] backend``.
        quiet: only warnings and errors on stderr; default: when ``--json`` was given.

    Raises:
        ConfigError: the config is missing or invalid (exit 2).
    """
    from neuron_build.log import configure
    from neuron_build.workspace import Workspace

    project = open_project(args)
    configure(project.make_state_dir() / "build.log", quiet=getattr(args, "json", False) if quiet is None else quiet)
    return Workspace(project, backend=backend)


def open_project_store(args: argparse.Namespace) -> tuple[Project, ArtifactStore]:
    """The project of ``args.config`` and its store, for commands that need no keys (and no log).

    Raises:
        ConfigError: the config is missing or invalid (exit 2).
    """
    from neuron_build.store import cached_store

    project = open_project(args)
    return project, cached_store(project.store_url(), project.remote_url(), project.config.build.remote_options)


# -- output ---------------------------------------------------------------------------------------------
#: The version of the shape of every ``--json`` document. Bump it when a field changes meaning or is
#: removed (adding a field does not bump it). Each document names its command: ``neuron-build/plan/v1``.
SCHEMA_VERSION = 1

#: The command being run (set by :func:`neuron_build.cli.main`), for :func:`schema_id`.
CURRENT_COMMAND: list[str] = []


def require_writable(store: ArtifactStore) -> None:
    """Stop before any work when ``store`` was opened read-only (a folder this user may not write): the
    command's one line is printed by :func:`neuron_build.cli.main` (exit 2).

    Raises:
        ReadOnlyStore: the store is read-only.
    """
    if store.read_only:
        import errno

        from neuron_build.store.core import ReadOnlyStore
        raise ReadOnlyStore(errno.EROFS, f"store {store.location} is opened read-only")


def schema_id(name: str | None = None) -> str:
    """``neuron-build/<name>/v<SCHEMA_VERSION>``; ``name`` defaults to the command being run."""
    return f"neuron-build/{name or (CURRENT_COMMAND[-1] if CURRENT_COMMAND else 'output')}/v{SCHEMA_VERSION}"


def json_doc(obj: Any, items: str = "items", name: str | None = None) -> dict[str, Any]:
    """The JSON document of a command: ``obj`` (a dict) with ``schema`` first, or a list wrapped as
    ``{"schema": ..., <items>: [...]}``. Every ``--json`` output goes through here, so every document
    carries its schema (the conventions: durations and ages are numbers of seconds in fields ending in
    ``_s``; judgements are words of :class:`neuron_build.status.Verdict` in a field ``verdict``)."""
    if isinstance(obj, dict):  # a document that names its own schema keeps it
        return {"schema": obj.get("schema") or schema_id(name), **{k: v for k, v in obj.items() if k != "schema"}}
    return {"schema": schema_id(name), items: list(obj)}


def print_json(obj: Any, items: str = "items", name: str | None = None) -> None:
    """Print :func:`json_doc` of ``obj`` as indented JSON on stdout (objects JSON cannot hold as their
    ``str()``)."""
    json.dump(json_doc(obj, items, name), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    JSON_PRINTED[0] = True


#: Whether this run printed its ``--json`` document (so an error after it adds no second document).
JSON_PRINTED: list[bool] = [False]


def positive_int(text: str) -> int:
    """An argparse ``type`` for a count of 1 or more (``-n/--jobs``, ``--max-buckets``): the whole number ``text``.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a whole number, or is below 1 (argparse prints it as a
            usage error naming the flag, exit 2).
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give 1 or more")
    return value


def seconds(value: float | None, digits: int = 3) -> float | None:
    """A duration or age for a JSON document: a number of seconds rounded to ``digits`` (None stays None)."""
    return None if value is None else round(float(value), digits)


def human_age(age_s: float | None) -> str:
    """An age in seconds as ``45s``, ``12m``, ``3h``, ``2d`` for people (``-`` for None)."""
    if age_s is None:
        return "-"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if age_s >= n:
            return f"{int(age_s // n)}{unit}"
    return f"{max(0, int(age_s))}s"


def display_text(text: str = "", *, end: str = "\n", flush: bool = False, stream: Any = None) -> None:
    """Print a command's result for people on stdout: a line, a table, a summary, the next step (``stream``:
    another text stream, e.g. the one a progress display was given)."""
    print(text, end=end, flush=flush, file=stream)


def display_line(text: str) -> None:
    """Print one line of a long command's progress on stdout, at once (not when the command ends)."""
    print(text, flush=True)


def display_note(text: str) -> None:
    """Print one progress or status line on stderr (kept off stdout, which may carry ``--json``)."""
    print(text, file=sys.stderr, flush=True)


def display_error(text: str, prefix: str = "error") -> None:
    """Print ``<prefix>: <text>`` on stderr: the one message of a command that failed."""
    print(f"{prefix}: {text}", file=sys.stderr)


def mib(n: int) -> str:
    """A byte count as ``"12.3 MiB"``."""
    return f"{n / 2**20:.1f} MiB"


__all__ = ["COMMANDS", "CURRENT_COMMAND", "SCHEMA_VERSION", "Handler", "command", "display_error", "display_line",
           "require_writable",
           "display_note", "display_text", "human_age", "json_doc", "mib", "open_project", "open_project_store",
           "open_workspace",
           "print_json", "schema_id", "seconds"]
