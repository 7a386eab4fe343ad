"""The project's vocabularies of outcomes, as enums that serialise as the strings the records hold.

Each enum is a ``str`` subclass, so ``Status.PASS == "PASS"``, ``json.dumps(Status.PASS)`` writes
``"PASS"`` and records written before these enums existed read back unchanged.
"""

from __future__ import annotations

from enum import Enum


class _Word(str, Enum):
    """A string enum whose ``str()`` is its value (so f-strings print ``PASS``, not ``Status.PASS``)."""

    def __str__(self) -> str:
        return str(self.value)


class Status(_Word):
    """The status of one compile, as a manifest or failure record holds it. Only PASS is ever served."""

    PASS = "PASS"                            # compiled
    ERROR = "ERROR"                          # the compiler (or the model's factory) reported an error
    KILLED = "KILLED"                        # killed by a signal (SIGKILL: usually the out-of-memory killer)
    TIMEOUT = "TIMEOUT"                      # ran past [build] timeout_s and was stopped
    TRANSIENT = "TRANSIENT"                  # exit status 70: a transient tool failure, retried
    TOOLCHAIN_MISSING = "TOOLCHAIN_MISSING"  # the backend's toolchain is not installed


class BuildResult(_Word):
    """What building one target did, beyond the compile's :class:`Status`: nothing to do."""

    CACHED = "cached"  # the store already held the artifact (or another builder made it meanwhile)


class TargetState(_Word):
    """A target's state in the store, as ``plan`` reports it."""

    CACHED = "cached"      # a complete artifact for the current key
    MISSING = "missing"    # never built for the current key
    FAILED = "failed"      # the last compile of the current key failed; the next build retries it


class Verdict(_Word):
    """The one vocabulary of judgements: a validation against the fp32 CPU reference, a promotion gate,
    a check (``verify``), a build target in ``build --json``."""

    PASS = "pass"      # outputs within tolerance / the gate or check holds / the target is in the store
    FAIL = "fail"      # outputs outside tolerance, or the artifact did not load or run / the gate refuses
    NOT_VALIDATED = "not_validated"   # this host cannot run the artifact (e.g. no NeuronCore)
    ERROR = "error"    # the check could not complete (the reference did not build, its process died): no verdict
    WAIVED = "waived"  # a failed gate let through with a recorded reason (promote --waive, --allow-unvalidated)

    @classmethod
    def of(cls, ok: bool) -> Verdict:
        """:attr:`PASS` when ``ok`` is true, else :attr:`FAIL`."""
        return cls.PASS if ok else cls.FAIL




#: The reason of a cached build outcome whose artifact came from the read-through store's remote.
DOWNLOADED = "downloaded from the remote store, every blob verified"

__all__ = ["DOWNLOADED", "Status", "BuildResult", "TargetState", "Verdict"]
