"""The read commands open a workspace, never a Builder: ``plan``, ``explain``, ``show``, ``ls``, ``status``,
``verify`` and ``release`` (which only reads the store until it records) construct no Builder, no executor,
no memory budget, no target recorder and no read recorder, and import no torch (issue 41; the shape of doit's ``list``, which
reads the dependency manager and never constructs a ``Runner``)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers.cli import REPO
from tests.helpers.projects import write_tiny_project

#: run in a fresh interpreter: every constructor a build needs is wrapped to record its class, then the CLI runs
#: each read command in-process; prints what was made, whether torch was imported and each command's exit status
PROBE = r'''
import json, sys
from neuron_build.build import builder, local, recorder
from neuron_build.project import reads
from neuron_build.store import budget
made = []
for cls in (builder.Builder, local.LocalExecutor, recorder.Recorder, budget.MemoryBudget, reads.ReadRecorder):
    def wrap(orig, name):
        def init(self, *a, **k):
            made.append(name)
            orig(self, *a, **k)
        return init
    cls.__init__ = wrap(cls.__init__, cls.__name__)
from neuron_build.cli import main
cfg = sys.argv[1]
rcs = {}
for argv in (["plan"], ["plan", "--json"], ["explain", "tiny/b1/fp32/p1"], ["explain", "tiny/b1/fp32/p1", "--json"],
             ["show", "tiny/b1/fp32/p1"], ["ls"], ["status"], ["verify", "--fresh"], ["release", "tiny"]):
    try:
        rcs[" ".join(argv)] = main(["-c", cfg, *argv])
    except SystemExit as e:
        rcs[" ".join(argv)] = e.code
print(json.dumps({"made": made, "torch": "torch" in sys.modules, "rcs": rcs}))
'''


def test_read_commands_construct_no_builder_executor_budget_or_recorders(tmp_path):
    cfg = write_tiny_project(tmp_path / "p")
    out = subprocess.run([sys.executable, "-c", PROBE, str(cfg)], capture_output=True, text=True, cwd=REPO,
                         timeout=300)
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["made"] == [] and doc["torch"] is False, out.stderr[-2000:]
    # each command ran to its own end: plan, explain, ls and status exit 0; show of an unbuilt target, verify
    # --fresh of unbuilt targets and a release of unbuilt buckets are refused (not a crash)
    rcs = doc["rcs"]
    assert {k: rcs[k] for k in ("plan", "plan --json", "explain tiny/b1/fp32/p1", "explain tiny/b1/fp32/p1 --json",
                                "ls", "status")} == dict.fromkeys(("plan", "plan --json", "explain tiny/b1/fp32/p1",
                                                                   "explain tiny/b1/fp32/p1 --json", "ls", "status"), 0)
    assert rcs["show tiny/b1/fp32/p1"] == 2 and rcs["release tiny"] != 0, rcs
