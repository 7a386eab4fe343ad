"""Exceptions that the CLI maps to exit codes.

``UserError`` and its subclasses are mistakes the user can fix (bad config, unknown target): exit 2,
one message, no traceback. ``BuildFailed`` means at least one target did not build: exit 1.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input. The message names the file, the key and the fix."""


class ConfigError(UserError):
    """An invalid ``buckets.toml``.

    Attributes:
        file: path of the config file, as given.
        faults: one line per fault: ``<toml path>: <what is wrong>; <what is allowed>``.
    """

    def __init__(self, file: str, faults: list[str]):
        self.file = file
        self.faults = list(faults)
        head = f"{file}: invalid configuration" + (f" ({len(faults)} faults)" if len(faults) > 1 else "")
        super().__init__(head + "\n" + "\n".join(f"  {f}" for f in faults))


class BuildFailed(Exception):
    """One or more targets failed to build (exit status 1)."""
