"""The ``neuron-build`` command: ``main`` and the parser; each command group is a module of this package.

A user error prints one message and exits 2; a failed build or check exits 1; Ctrl-C exits 130 (the
table in :mod:`neuron_build.errors`); no traceback unless ``--debug``. The shared pieces (command
registry, ``open_workspace``, output helpers) are in :mod:`neuron_build.cli.app`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from neuron_build.cli.app import COMMANDS, CURRENT_COMMAND, JSON_PRINTED, display_error, display_text
from neuron_build.errors import BuildFailed, ExitCode, NeuronBuildError, exit_code

#: The command modules, in the order their commands appear in ``--help``: each defines ``register(add)``,
#: where ``add(name, help)`` returns an argparse sub-parser, and decorates its handlers with
#: :func:`neuron_build.cli.app.command`. Keep them free of torch imports.
COMMAND_MODULES: tuple[str, ...] = (
    "neuron_build.cli.build",       # build
    "neuron_build.cli.inspect",     # plan, explain, ls, show
    "neuron_build.cli.parse_log",   # parse-log
    "neuron_build.cli.doctor",      # doctor
    "neuron_build.cli.validate",    # validate
    "neuron_build.cli.bench",       # bench
    "neuron_build.cli.release",     # release, promote, rollback, channels, history, pull
    "neuron_build.cli.serve",       # warmup
    "neuron_build.cli.buckets",     # buckets suggest
    "neuron_build.cli.store",       # verify, gc
    "neuron_build.cli.sync",        # push, fetch, status
    "neuron_build.cli.monitor",     # failures, report, metrics
    "neuron_build.cli.init",        # init
    "neuron_build.cli.completion",  # completion
)


def _version() -> str:
    """The installed distribution's version (``importlib.metadata``), or ``unknown``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("neuron-build")
    except PackageNotFoundError:
        return "unknown"


#: The schema of the JSON object an error (a usage error, a store that failed) prints on stdout under ``--json``
#: (with ``error``, ``exit_code``).
ERROR_SCHEMA = "neuron-build/error/v1"
_JSON_ERRORS: list[bool] = [False]  # this run asked for --json: a usage error is a JSON object on stdout too


def print_json_error(text: str, code: int = ExitCode.USAGE) -> None:
    """Print ``{"schema": "neuron-build/error/v1", "error": text, "exit_code": code}`` on stdout, when the
    command line has ``--json`` (a reader of stdout gets a document, not nothing)."""
    if _JSON_ERRORS[0]:
        import json

        display_text(json.dumps({"schema": ERROR_SCHEMA, "error": text, "exit_code": int(code)}), flush=True)


class _Parser(argparse.ArgumentParser):
    """argparse's parser; under ``--json`` a usage error is also a JSON object on stdout."""

    def error(self, message: str):
        print_json_error(f"{self.prog}: {message}")
        super().error(message)


def parser() -> argparse.ArgumentParser:
    """The ``neuron-build`` argument parser: the common options and every command module's sub-commands."""
    common = _Parser(add_help=False)
    common.add_argument("-c", "--config", default=argparse.SUPPRESS, help="path of buckets.toml")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    p = _Parser(prog="neuron-build", parents=[common],
                                description="Compile-artifact build system for AWS Neuron.")
    p.add_argument("--version", action="version", version=f"neuron-build {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str):
        return sub.add_parser(name, parents=[common], help=help, description=help)

    for mod in COMMAND_MODULES:
        importlib.import_module(mod).register(add)
    return p


#: What each command writes into the store (for the one line a read-only store gets).
WRITES = {"release": "a release record", "promote": "the channel pointer and its history",
          "rollback": "the channel pointer and its history", "validate": "validation results",
          "bench": "benchmark results", "build": "artifacts", "push": "artifacts", "fetch": "artifacts",
          "gc": "its removals", "verify": "quarantined objects"}


def read_only_line(command: str, e: OSError, store_option: bool = False) -> str:
    """The one line for a command that had to write into a read-only store (``e``: the
    :class:`~neuron_build.store.local.ReadOnlyStore` raised, whose text names the store); ``--store`` is
    advised only for a command that has that option (``store_option``)."""
    text = str(e.strerror or e)
    store = text.removeprefix("store ").split(" is opened read-only")[0] if text.startswith("store ") else "the store"
    what = WRITES.get(command, "its records")
    where = "[build] store (buckets.toml) or --store" if store_option else "[build] store (buckets.toml)"
    return (f"store {store} is read-only: `neuron-build {command}` writes {what} into it; make it writable (or run "
            f"as a user who may write it), or point {where} at a writable store")


#: What a command stopped by Ctrl-C leaves behind (for the one line it prints); others: :data:`KEPT_DEFAULT`.
KEPT = {"build": "the targets it finished stay built in the store; run it again to build the rest",
        "push": "the artifacts it copied stay on the remote; run it again to push the rest",
        "fetch": "the artifacts it copied stay in the local store; run it again to fetch the rest",
        "pull": "the files it verified stay in the destination; run it again to pull the rest"}
KEPT_DEFAULT = "what it finished writing is kept and nothing half-written is left in the store"


def interrupted_line(command: str) -> str:
    """The one line a command stopped by Ctrl-C prints: what was interrupted and what was kept."""
    return f"`neuron-build {command}` stopped by Ctrl-C; {KEPT.get(command, KEPT_DEFAULT)}"


#: Arguments that carry a model or channel name (each becomes part of a file name in the store).
NAME_ARGS = {"model": "model", "to": "channel", "from_channel": "channel", "channel": "channel"}


def _long_name(args: argparse.Namespace) -> str | None:
    """The one line for a model or channel name argument longer than the config allows, or None."""
    from neuron_build.project.config import long_name_fault

    for attr, kind in NAME_ARGS.items():
        value = getattr(args, attr, None)
        fault = long_name_fault(kind, value) if isinstance(value, str) else None
        if fault:
            return f"{fault}; no {kind} of buckets.toml has such a name"
    return None


#: Options whose value may start with ``-`` and a digit (``--since -3h``): argparse would read such a value as
#: an option, so :func:`main` passes it as ``--since=-3h``.
DASH_VALUE_OPTIONS = ("--since",)


def _glue_dash_values(argv: list[str]) -> list[str]:
    """``argv`` with each ``OPTION -<digit>...`` of :data:`DASH_VALUE_OPTIONS` written ``OPTION=-<digit>...``
    (anything after ``--`` is left as it is)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if a in DASH_VALUE_OPTIONS and len(nxt) > 1 and nxt[0] == "-" and nxt[1].isdigit():
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _read_only(e: OSError) -> bool:
    from neuron_build.store.core import ReadOnlyStore

    return isinstance(e, ReadOnlyStore)


def main(argv: list[str] | None = None) -> int:
    """Run one ``neuron-build`` command (``argv``: the arguments after the program name; default
    ``sys.argv[1:]``) and return its exit status (:class:`neuron_build.errors.ExitCode`)."""
    argv = _glue_dash_values(sys.argv[1:] if argv is None else list(argv))
    _JSON_ERRORS[0] = "--json" in argv
    args = parser().parse_args(argv)
    args.config = getattr(args, "config", None) or os.environ.get("NEURON_BUILD_CONFIG") or None
    args.debug = getattr(args, "debug", False)
    CURRENT_COMMAND[:] = [args.command]
    too_long = _long_name(args)
    if too_long:
        display_error(too_long)
        print_json_error(too_long)
        return int(ExitCode.USAGE)
    try:
        return int(COMMANDS[args.command](args))
    except NeuronBuildError as e:
        if args.debug:
            raise
        if isinstance(e, OSError) and _read_only(e):
            line = read_only_line(args.command, e, store_option=hasattr(args, "store"))
            display_error(line, prefix="error")
            print_json_error(line)
            return exit_code(e)
        display_error(str(e), prefix="build failed" if isinstance(e, BuildFailed) else "error")
        if exit_code(e) == ExitCode.USAGE:
            print_json_error(str(e))
        elif not isinstance(e, BuildFailed) and not JSON_PRINTED[0]:  # a store that failed: still one document
            print_json_error(str(e), exit_code(e))
        return exit_code(e)
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        display_error(interrupted_line(args.command), prefix="interrupted")
        return exit_code(e)
    except BrokenPipeError as e:  # the reader went away (`neuron-build plan --json | head -1`)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        return exit_code(e)


__all__ = ["COMMAND_MODULES", "ERROR_SCHEMA", "interrupted_line", "main", "parser", "print_json_error"]
