"""The validation subprocess: ``python -m neuron_build.evaluate.validate_worker JOB.pkl OUT.json``.

Every validation runs in a fresh Python process (:func:`neuron_build.evaluate.validate.validate_target`
starts one), so that nothing of torch's process-wide state can leak into a verdict: the global random
generator a factory seeds and draws its weights from (two validations in threads of one process, as doit's
thread runner runs them, interleave their draws and each gets other weights than the artifact was built
with), the default dtype, autocast, the number of threads, transformers' lazily imported auto classes (a
concurrent first import raises ``ImportError ... has no auto class``), and no fork after torch is imported.

``JOB.pkl`` is written by the parent in a private temporary folder (a pickle, trusted as the parent's own
file, never read from a store): ``(project, view, target, key, key_table, record)``. The worker writes
``OUT.json`` atomically: ``{"record": {...}}`` (the filled validation record, non-finite floats as
strings), or ``{"user_error": "one line"}``. Exit status 0 either way; anything else (a crash, a kill)
leaves no ``OUT.json`` and the parent records the validation as ``error``.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from neuron_build.util import write_json_atomic


def main(argv: list[str] | None = None) -> int:
    """Run one validation job; returns the process exit status (0 when ``OUT.json`` was written)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m neuron_build.evaluate.validate_worker JOB.pkl OUT.json", file=sys.stderr)
        return 2
    job, out = Path(args[0]), Path(args[1])
    from neuron_build.errors import UserError
    from neuron_build.evaluate.validate import json_safe
    from neuron_build.evaluate.validate_run import validate_here

    with job.open("rb") as f:
        project, view, target, key, key_table, rec = pickle.load(f)  # the parent's own file
    try:
        rec = validate_here(project, view, target, key, key_table, rec)
    except UserError as e:
        write_json_atomic(out, {"user_error": str(e)})
        return 0
    write_json_atomic(out, {"record": json_safe(rec)})
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
