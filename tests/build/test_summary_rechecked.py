"""A target whose recorded inputs changed (here: the version of a distribution its factory imports) is
checked again: its graph is probed (or it compiles). When the graph did not change nothing is compiled and
the target counts as cached, but the summary says what was re-checked and why, in one line (a second
checkout whose venv differs in a package re-probes its targets: that work is never hidden under "cached")."""

from __future__ import annotations

import os
from pathlib import Path

from neuron_build.build.summary import BuildSummary
from tests.helpers.cli import run_cli
from tests.helpers.projects import write_tiny_project

FACTORY = '''\
import rcdep
import torch


def build():
    torch.manual_seed(1)
    return torch.nn.Linear(16, 3 + rcdep.EXTRA)
'''


def _dist(site: Path, version: str) -> None:
    """A distribution ``rcdep`` at ``version`` in ``site`` (a folder on PYTHONPATH)."""
    (site / "rcdep").mkdir(parents=True, exist_ok=True)
    (site / "rcdep" / "__init__.py").write_text("EXTRA = 0\n")
    for old in site.glob("rcdep-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"rcdep-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rcdep\nVersion: {version}\n")
    (info / "top_level.txt").write_text("rcdep\n")
    (info / "RECORD").write_text("rcdep/__init__.py,,\n")


def test_targets_rechecked_for_a_changed_package_are_named_in_the_summary(tmp_path):
    site = tmp_path / "site"
    _dist(site, "10.0")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    cfg = write_tiny_project(tmp_path / "proj")
    (cfg.parent / "tinylib" / "other.py").write_text(FACTORY)
    first = run_cli("-c", str(cfg), "build", "other", env=env, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in first.stdout
    assert "re-checked" not in first.stdout

    _dist(site, "11.0")  # the package changed, the model did not
    again = run_cli("-c", str(cfg), "build", "other", env=env, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 target: 0 built, 1 cached, 0 failed" in again.stdout, again.stdout
    assert ("  1 target re-checked because package rcdep 10.0 -> 11.0: 1 unchanged (nothing compiled)"
            in again.stdout.splitlines()), again.stdout

    third = run_cli("-c", str(cfg), "build", "other", env=env, timeout=300)  # nothing changed since
    assert "1 target: 0 built, 1 cached, 0 failed" in third.stdout and "re-checked" not in third.stdout


def test_the_recheck_line_counts_and_names_each_reason_once():
    s = BuildSummary(["a", "b", "c", "d"], built=["c"], reused=[], failed=["d"],
                     rechecked={"a": ("package pillow 10.0 -> 11.0",), "b": ("package pillow 10.0 -> 11.0",
                                                                             "recorded read data/x.bin changed"),
                                "c": ("package pillow 10.0 -> 11.0",)})
    assert s.recheck_line() == ("  3 targets re-checked because package pillow 10.0 -> 11.0, recorded read "
                                "data/x.bin changed: 2 unchanged (nothing compiled), 1 compiled")
    assert s.text().splitlines()[1:3] == ["4 targets: 1 built, 2 cached, 1 failed", s.recheck_line()]
    assert BuildSummary(["a"], [], [], []).recheck_line() is None


def test_a_rechecked_target_says_why_in_its_progress_line_and_in_the_doit_summary():
    import io

    from neuron_build.build.attempt import Outcome
    from neuron_build.build.display import BuildDisplay
    from neuron_build.build.summary import from_outcomes
    from neuron_build.status import Status

    out = io.StringIO()
    d = BuildDisplay(2, slots=1, stream=out)
    why = ("package pillow 10.0 -> 11.0", "recorded variable HF_HOME changed")
    same = Outcome("m/b1", "k1", Status.PASS, "graph unchanged: reused abc", metrics={"compile_time_s": 1.5},
                   rechecked=why)
    d.finished(same)
    d.finished(Outcome("m/b2", "k2", Status.PASS, compiled=True, metrics={"compile_time_s": 2.0}))
    d.stop()
    first = out.getvalue().splitlines()[0]
    assert first.startswith("[1/2] m/b1 PASS in 1.5 s (re-checked: package pillow 10.0 -> 11.0 and 1 more)"), first
    s = from_outcomes(["m/b1", "m/b2"], {"m/b1": same, "m/b2": Outcome("m/b2", "k2", Status.PASS, compiled=True)})
    assert s.text().splitlines()[1:3] == [
        "2 targets: 1 built, 1 cached, 0 failed",
        "  1 target re-checked because package pillow 10.0 -> 11.0, recorded variable HF_HOME changed: "
        "1 unchanged (nothing compiled)"]


def test_a_relinked_target_is_said_relinked_not_unchanged():
    """A fine-tune's relink publishes new weights: the summary said ``2 unchanged (nothing compiled)`` and
    ``build --json`` ``cached``; it is a graph reuse with new weights, said so."""
    from neuron_build.build.attempt import Outcome
    from neuron_build.build.graph.relink import RELINKED
    from neuron_build.build.summary import from_outcomes
    from neuron_build.status import Status

    why = ("recorded read ckpt.safetensors changed",)
    new = Outcome("m/b1", "k1", Status.PASS, RELINKED.format(source="k0"), metrics={"compile_time_s": 1.0},
                  rechecked=why)
    s = from_outcomes(["m/b1", "m/b2"], {"m/b1": new, "m/b2": Outcome("m/b2", "k2", Status.PASS, compiled=True)})
    assert s.relinked == ["m/b1"]
    assert s.text().splitlines()[1:3] == [
        "2 targets: 1 built, 1 cached (1 relinked with new weights), 0 failed",
        "  1 target re-checked because recorded read ckpt.safetensors changed: "
        "1 relinked (new weights, nothing compiled)"]
