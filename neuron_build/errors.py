"""The exception root and the one exit-code table.

Every error the tool raises on purpose derives from :class:`NeuronBuildError` (``tests/test_exceptions.py``
holds every exception class of the package to it), keeping a builtin base where callers catch that
(``ReadOnlyStore`` is an ``OSError``, ``HFSourceError`` a ``ValueError``). Two are signals inside the
compile worker, not failures, and never reach a command: ``GraphHit`` (the graph index holds the graph:
stop before compiling) and ``NoGraphKey`` (the graph has no key: compile). ``CompileFailed`` carries the
worker's own exit status (``EXIT_TOOLCHAIN_MISSING``, 3, for a missing toolchain), which the build reads.
:func:`exit_code` maps an exception to the process exit status (``neuron-build`` and ``doit build`` alike):

=====  =====================================================================
code   meaning
=====  =====================================================================
0      ok
1      a build or a check failed (:class:`BuildFailed`, a failed verify)
2      usage or configuration error (:class:`UserError`; a write into a read-only store)
3      refused by a gate: a promotion that did not move the channel (``PromotionRefused``)
130    interrupted (Ctrl-C)
141    the reader of the output went away (a closed pipe: the shell's 128 + SIGPIPE)
=====  =====================================================================
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit statuses (the table above)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    REFUSED = 3
    INTERRUPTED = 130
    BROKEN_PIPE = 141


class NeuronBuildError(Exception):
    """Root of the errors neuron-build raises on purpose. ``exit_code`` is the process exit status."""

    exit_code: ExitCode = ExitCode.FAILED


class UserError(NeuronBuildError):
    """A mistake in the user's input. The message names the file, the key and the fix (exit 2)."""

    exit_code = ExitCode.USAGE


class FactoryNotImportable(UserError, ImportError):
    """A release's recorded model factory does not import from the folder given as ``factory_root``
    (``--factory-root``): the project folder that holds its module is another (exit 2)."""


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


class BuildFailed(NeuronBuildError):
    """One or more targets failed to build (exit status 1)."""

    exit_code = ExitCode.FAILED


class StoreError(NeuronBuildError):
    """A remote store (``s3://``, any fsspec URL) could not be used. The message is one line naming the URL
    and the fix.

    Attributes:
        url: the store's URL.
        writing: True when the failed operation was a write (publish, a record, a channel swap): the
            write did not happen, and nothing half-published is left. False for a read, which a
            read-through cache treats as a miss (fail open: one warning, the build goes on locally).
    """

    def __init__(self, message: str, url: str, writing: bool):
        super().__init__(message)
        self.url = url
        self.writing = writing


class StoreUnreachable(StoreError):
    """The store's endpoint cannot be reached (connection refused or timed out, name not resolved)."""


#: URL schemes of the stores the tool knows how to reach (any other fsspec protocol works too when its
#: package is installed; these are the ones named in messages).
STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "file", "memory")


class StoreNotOpened(UserError):
    """A store URL whose filesystem could not even be made: fsspec's filesystem connects when it is created
    (``ftp://``, ``sftp://``) and the host did not resolve, refused the connection or timed out (exit 2).

    Attributes:
        url: the store's URL; reason: what failed, one line (``gaierror: [Errno -2] Name or service not known``).
    """

    def __init__(self, url: str, reason: str, label: str = "store"):
        self.url, self.reason = url, reason
        super().__init__(f"{label} {url!r} cannot be opened: connecting failed ({reason}); check the host and port "
                         f"in the URL, or use a store URL of one of " + ", ".join(f"{s}://" for s in STORE_SCHEMES))

    def labelled(self, label: str) -> StoreNotOpened:
        """The same error, its message naming the store as ``label`` (``[build] remote``)."""
        return StoreNotOpened(self.url, self.reason, label)


class StoreIsAFile(StoreNotOpened):
    """A ``file://`` store URL whose path (or a folder on the way to it) is a regular file: a store is a
    folder (exit 2).

    Attributes:
        url: the store's URL; reason: the path that is a file.
    """

    def __init__(self, url: str, reason: str, label: str = "store"):
        self.url, self.reason = url, reason
        UserError.__init__(self, f"{label} {url!r} is a file, not a folder ({reason} is a file); point {label} at a "
                                 f"folder (a new or existing store), e.g. file:///path/to/store")

    def labelled(self, label: str) -> StoreIsAFile:
        """The same error, its message naming the store as ``label`` (``[build] remote``)."""
        return StoreIsAFile(self.url, self.reason, label)


class StoreDenied(StoreError):
    """The store refused the credentials, or there are none (HTTP 403, no credentials found)."""

    exit_code = ExitCode.USAGE


class StoreMissing(StoreError):
    """The store's bucket (or base folder) does not exist."""

    exit_code = ExitCode.USAGE


class StoreFailed(StoreError):
    """The store answered with a server error (5xx) or kept throttling (503 SlowDown) after the client
    library's retries with backoff."""


def exit_code(exc: BaseException) -> int:
    """The exit status for an exception that reached the top of a command (the module table)."""
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    if isinstance(exc, BrokenPipeError):
        return int(ExitCode.BROKEN_PIPE)
    if isinstance(exc, NeuronBuildError):
        return int(exc.exit_code)
    return int(ExitCode.FAILED)


__all__ = ["STORE_SCHEMES", "BuildFailed", "ConfigError", "ExitCode", "FactoryNotImportable", "NeuronBuildError",
           "StoreDenied", "StoreError", "StoreFailed", "StoreIsAFile", "StoreMissing", "StoreNotOpened",
           "StoreUnreachable", "UserError", "exit_code"]
