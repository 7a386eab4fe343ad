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

    @property
    def meaning(self) -> str:
        """One line saying what the value means."""
        return _MEANINGS.get(self, "")


class Status(_Word):
    """The status of one compile, as a manifest or failure record holds it. Only PASS is ever served."""

    PASS = "PASS"
    ERROR = "ERROR"
    KILLED = "KILLED"
    TIMEOUT = "TIMEOUT"
    TRANSIENT = "TRANSIENT"
    TOOLCHAIN_MISSING = "TOOLCHAIN_MISSING"


class BuildResult(_Word):
    """What building one target did, beyond the compile's :class:`Status`: nothing to do."""

    CACHED = "cached"


class TargetState(_Word):
    """A target's state in the store, as ``plan`` reports it."""

    CACHED = "cached"      # a complete artifact for the current key
    MISSING = "missing"    # never built for the current key
    FAILED = "failed"      # the last compile of the current key failed; the next build retries it


class Verdict(_Word):
    """The verdict of a validation against the fp32 CPU reference."""

    PASS = "pass"
    FAIL = "fail"
    NOT_VALIDATED = "not_validated"   # this host cannot run the artifact (e.g. no NeuronCore)


_MEANINGS = {
    Status.PASS: "compiled",
    Status.ERROR: "the compiler reported an error",
    Status.KILLED: "the compile was killed by a signal (SIGKILL is usually the kernel's out-of-memory killer)",
    Status.TIMEOUT: "the compile ran past timeout_s and was stopped",
    Status.TRANSIENT: "the compiler exited with status 70 (a transient tool failure)",
    Status.TOOLCHAIN_MISSING: "the backend's toolchain is not installed",
    BuildResult.CACHED: "the store already held the artifact; nothing compiled",
    TargetState.CACHED: "the store holds a complete artifact for the current key",
    TargetState.MISSING: "not built for the current key",
    TargetState.FAILED: "the last compile of the current key failed; the next build retries it",
    Verdict.PASS: "outputs within tolerance of the fp32 CPU reference",
    Verdict.FAIL: "outputs outside tolerance of the fp32 CPU reference",
    Verdict.NOT_VALIDATED: "this host cannot run the artifact",
}

#: Manifest statuses and their meaning (kept for readers of the old ``manifest.STATUSES`` table).
STATUSES = {s.value: s.meaning for s in Status}

__all__ = ["Status", "BuildResult", "TargetState", "Verdict", "STATUSES"]
