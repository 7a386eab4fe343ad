"""``neuron-build validate [PATTERN...] [--json]``: check built artifacts against the eager fp32 CPU
reference and record the results beside them (see :mod:`neuron_build.evaluate.validate`).

Exit status: 0 when every selected target passed (or is recorded as not validated because this host
cannot run it), 1 when one failed or is not built, 2 for a user error (bad config, unknown pattern).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from neuron_build.cli.app import (
    command,
    display_line,
    display_note,
    display_text,
    open_workspace,
    print_json,
    require_writable,
)
from neuron_build.errors import ExitCode
from neuron_build.status import Verdict
from neuron_build.util import plural

if TYPE_CHECKING:
    from neuron_build.evaluate.validate import ValidationRecord
    from neuron_build.workspace import Workspace


def register(add) -> None:
    """Add the ``validate`` sub-command."""
    s = add("validate", "check built artifacts against the eager fp32 CPU reference")
    s.add_argument("patterns", nargs="*", metavar="PATTERN", help="target id globs or model names (default: all)")
    s.add_argument("--json", action="store_true", help="print the stored result records")


@dataclass
class ValidationRun:
    """The validations of one ``validate``: the stored records, and the chosen targets not built."""

    targets: list[str]
    records: list[ValidationRecord] = field(default_factory=list)
    not_built: list[str] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        """How many records have ``verdict``."""
        return sum(r["verdict"] == verdict for r in self.records)

    @property
    def ok(self) -> bool:
        """No target failed or ended in an error, and every one was built."""
        return not self.count(Verdict.FAIL) and not self.count(Verdict.ERROR) and not self.not_built

    def summary(self) -> str:
        """The last line ``validate`` prints."""
        return (f"{plural(len(self.targets), 'target')}: {self.count(Verdict.PASS)} passed, {self.count(Verdict.FAIL)} failed, "
                f"{self.count(Verdict.NOT_VALIDATED)} not validated, {len(self.not_built)} not built"
                + (f", {n} ended in an error (no verdict)" if (n := self.count(Verdict.ERROR)) else ""))


def validate_selected(ws: Workspace, chosen, progress: Callable[[str], None] | None = None) -> ValidationRun:
    """Validate (and record) each chosen target whose current key is built; report the others.

    ``progress`` gets one line per target as it finishes (and the diagnosis notes of a failure).
    """
    from neuron_build.evaluate.validate import summary_line, validate_target

    run = ValidationRun([t.id for t in chosen])
    for t in chosen:
        key = ws.key(t).key
        if not ws.store.is_complete(key):
            run.not_built.append(t.id)
            if progress:
                progress(f"NOT BUILT  {t.id}: run `neuron-build build {t.id}` (or `doit validate:{t.id}`)")
            continue
        rec = validate_target(ws.project, ws.store, t, key, keys=ws.keys)
        run.records.append(rec)
        if progress:
            progress(summary_line(rec))
            for note in rec.get("diagnosis", []):
                progress(f"    {note}")
    ws.keys.save()
    return run


@command("validate")
def cmd_validate(args) -> int:
    """Validate the selected targets' artifacts; a target that is not built is reported, not compiled."""
    from neuron_build.project.matrix import select

    ws = open_workspace(args)
    require_writable(ws.store)  # before any benchmark or validation runs
    run = validate_selected(ws, select(ws.targets, args.patterns), progress=None if args.json else display_line)
    if args.json:
        print_json(run.records, "records")
        if not run.ok:
            display_note(f"{run.count(Verdict.FAIL)} failed, {run.count(Verdict.ERROR)} ended in an error, "
                         f"{len(run.not_built)} not built")
    else:
        display_text(run.summary())
    return ExitCode.OK if run.ok else ExitCode.FAILED


__all__ = ["ValidationRun", "register", "validate_selected"]
