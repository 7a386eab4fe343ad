"""The ``neuron-build`` command: ``main`` and the parser; each command group is a module of this package.

A user error prints one message and exits 2; a failed build or check exits 1; Ctrl-C exits 130 (the
table in :mod:`neuron_build.errors`); no traceback unless ``--debug``. The shared pieces (command
registry, ``open_builder``, output helpers) are in :mod:`neuron_build.cli.app`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from neuron_build.cli.app import COMMANDS, CURRENT_COMMAND, display_error
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


def parser() -> argparse.ArgumentParser:
    """The ``neuron-build`` argument parser: the common options and every command module's sub-commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-c", "--config", default=argparse.SUPPRESS, help="path of buckets.toml")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    p = argparse.ArgumentParser(prog="neuron-build", parents=[common],
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


def read_only_line(command: str, e: OSError) -> str:
    """The one line for a command that had to write into a read-only store (``e``: the
    :class:`~neuron_build.store.local.ReadOnlyStore` raised, whose text names the store)."""
    text = str(e.strerror or e)
    store = text.removeprefix("store ").split(" is opened read-only")[0] if text.startswith("store ") else "the store"
    what = WRITES.get(command, "its records")
    return (f"store {store} is read-only: `neuron-build {command}` writes {what} into it; make it writable (or run "
            f"as a user who may write it), or point [build] store (buckets.toml) or --store at a writable store")


def main(argv: list[str] | None = None) -> int:
    """Run one ``neuron-build`` command (``argv``: the arguments after the program name; default
    ``sys.argv[1:]``) and return its exit status (:class:`neuron_build.errors.ExitCode`)."""
    args = parser().parse_args(argv)
    args.config = getattr(args, "config", None) or os.environ.get("NEURON_BUILD_CONFIG") or None
    args.debug = getattr(args, "debug", False)
    CURRENT_COMMAND[:] = [args.command]
    try:
        return int(COMMANDS[args.command](args))
    except NeuronBuildError as e:
        if args.debug:
            raise
        display_error(str(e), prefix="build failed" if isinstance(e, BuildFailed) else "error")
        return exit_code(e)
    except KeyboardInterrupt as e:
        return exit_code(e)
    except BrokenPipeError as e:  # the reader went away (`neuron-build plan --json | head -1`)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        return exit_code(e)
    except OSError as e:
        from neuron_build.store.local import ReadOnlyStore

        if args.debug or not isinstance(e, ReadOnlyStore):
            raise
        display_error(read_only_line(args.command, e), prefix="error")
        return int(ExitCode.USAGE)


__all__ = ["COMMAND_MODULES", "main", "parser"]
