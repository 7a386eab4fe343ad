"""Progress people can read: the live display on a terminal (what compiles for how long, N of M, an ETA from
the recorded compile times), plain lines elsewhere, and one summary that prints each failure once with its
reason and the command that shows its log (``neuron-build build`` and ``doit build``)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from neuron_build.build.attempt import Outcome
from neuron_build.build.display import BuildDisplay, make_console
from neuron_build.build.summary import from_outcomes
from neuron_build.status import BuildResult, Status
from tests.helpers.cli import REPO, in_a_terminal, run_cli
from tests.helpers.projects import write_tiny_project

SGR = re.compile(r"\x1b\[[0-9;]*m")  # an escape code for colour or style
ANSI = re.compile(r"\x1b\[")


def tickers() -> int:
    """Live progress tickers (the display's redraw threads, ``neuron-build-progress``) in this process."""
    return sum(t.name == "neuron-build-progress" and t.is_alive() for t in threading.enumerate())


def lands_in(out: io.StringIO, capsys, word: str, level: str = "warning") -> str:
    """Where a log event (``level``) logged now is printed: above the live area (``display``, the
    display's console ``out``), on ``stderr``, or ``nowhere`` (a live display drops info events)."""
    from neuron_build.log import get_logger
    getattr(get_logger(), level)(word)
    err = capsys.readouterr().err
    return "display" if word in out.getvalue() else "stderr" if word in err else "nowhere"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def passed(tid: str, seconds: float) -> Outcome:
    return Outcome(tid, "k" * 64, Status.PASS, compiled=True, metrics={"compile_time_s": seconds})


def test_live_area_names_what_compiles_for_how_long_with_n_of_m_and_eta(monkeypatch, capsys):
    out = io.StringIO()
    idle = tickers()
    clock = Clock()
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    d = BuildDisplay(3, slots=2, expect={"m/a": 60.0, "m/b": None}.get, pending={"m/c": 100.0},
                     console=Console(file=out, force_terminal=True, width=100), clock=clock)
    d.started("m/a")
    clock.t += 20
    d.started("m/b")
    clock.t += 22
    # running: m/a 42 s of 60, m/b 22 s (never recorded: the mean of 60 and 100); pending m/c 100 s
    # slots free after 60 - 42 = 18 s and 80 - 22 = 58 s; m/c (100 s) takes the first: ends at 118 s
    assert d.status_lines() == ["0/3 done · ETA 1m58s", "compiling m/a (42 s, usually 1m00s)", "compiling m/b (22 s)"]
    assert d.showing and tickers() == idle + 1
    assert lands_in(out, capsys, "a warning while it shows") == "display"
    assert lands_in(out, capsys, "an info while it shows", "info") == "nowhere"
    d.refresh()
    screen = out.getvalue()
    assert "compiling m/a (42 s, usually 1m00s)" in screen and "0/3 done · ETA 1m58s" in screen
    d.finished(passed("m/a", 41.7))
    assert "[1/3] m/a \x1b[32mPASS\x1b[0m in 41.7 s; 2 left, about " in out.getvalue()
    assert d.status_lines()[0].startswith("1/3 done · ETA ")
    d.stop()
    assert not d.showing and tickers() == idle
    assert lands_in(out, capsys, "an info once it stopped", "info") == "stderr"  # the log is stderr's again


def test_the_ticker_redraws_about_every_second():
    out = io.StringIO()
    clock = Clock()
    d = BuildDisplay(1, console=Console(file=out, force_terminal=True, width=100), clock=clock)
    d.started("m/a")
    for s in (1, 2, 3):
        clock.t += 1
        deadline = time.monotonic() + 3
        while f"compiling m/a ({s} s)" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"compiling m/a ({s} s)" in out.getvalue()  # redrawn by the ticker, nobody else called
    d.stop()


def test_ctrl_c_and_failures_stop_the_ticker_and_restore_the_log(capsys):
    out, idle = io.StringIO(), tickers()
    d = BuildDisplay(2, console=Console(file=out, force_terminal=True))
    with pytest.raises(KeyboardInterrupt), d:
        d.started("m/a")
        assert tickers() == idle + 1 and lands_in(out, capsys, "a warning while it shows") == "display"
        raise KeyboardInterrupt
    assert tickers() == idle and not d.showing
    assert lands_in(out, capsys, "an info after Ctrl-C", "info") == "stderr"
    d.started("m/b")  # a stopped display never starts again
    assert not d.showing
    d.stop()  # idempotent


def test_no_color_means_no_escape_codes_for_colour_or_style(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    for env, coloured in (({"FORCE_COLOR": "1"}, True), ({"NO_COLOR": "1"}, False)):
        monkeypatch.delenv("NO_COLOR", raising=False)
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        out = io.StringIO()
        d = BuildDisplay(2, console=make_console(out, terminal=True))
        d.started("m/a")
        d.finished(Outcome("m/a", "k" * 64, Status.ERROR, "RuntimeError: boom", compiled=True,
                           metrics={"compile_time_s": 1.0}))
        d.stop()
        text = out.getvalue()
        assert "compiling m/a (0 s)" in text and "[1/2] m/a " in text
        assert bool(SGR.search(text)) is coloured, (env, text)


def test_plain_lines_off_a_terminal_from_parallel_threads():
    out = io.StringIO()
    d = BuildDisplay(8, slots=4, stream=out)
    assert d.live is False

    def one(i: int) -> None:
        d.started(f"m/{i}")
        d.finished(passed(f"m/{i}", 2.0))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 8 and not ANSI.search(out.getvalue())
    assert [ln.split()[0] for ln in lines] == [f"[{i}/8]" for i in range(1, 9)]
    assert all(re.fullmatch(r"\[\d/8\] m/\d PASS in 2\.0 s(; \d left, about \d+ s)?", ln) for ln in lines), lines


def test_summary_of_a_doit_run_counts_what_did_not_run_and_reports_of_other_processes():
    outcomes = {"m/a": passed("m/a", 3.0),
                "m/b": Outcome("m/b", "k" * 64, Status.TIMEOUT, "compile timed out after 120 s", compiled=True),
                "m/d": Outcome("m/d", "k" * 64, BuildResult.CACHED, "reused: built by pid 7 on h while ...")}
    s = from_outcomes(["m/a", "m/b", "m/c", "m/d", "m/e", "m/f"], outcomes, hits=["m/c"],
                      reported={"m/e": "m/e: ERROR: OSError: disk full\n", "m/a": None})
    assert (s.built, s.reused, s.failed, s.cached) == (["m/a"], ["m/d"], ["m/b", "m/e", "m/f"], 2)
    assert s.text() == ("\n6 targets: 1 built, 2 cached (1 built by another builder meanwhile), 3 failed\n"
                        "  FAILED m/b: TIMEOUT: compile timed out after 120 s\n    log: neuron-build show m/b\n"
                        "  FAILED m/e: ERROR: OSError: disk full\n    log: neuron-build show m/e\n"
                        "  FAILED m/f: not built: the build stopped before this target finished (see the errors "
                        "above)")
    s2 = from_outcomes(["m/a", "m/f"], outcomes, interrupted=True)  # Ctrl-C: m/f did not finish
    # no "log: neuron-build show m/f": a target that never finished has no log (show says "not built")
    assert s2.lines == ["  FAILED m/f: INTERRUPTED: Ctrl-C stopped the build before it finished"]
    out = io.StringIO()
    s2.print(out, rich=True, width=120)
    assert "INTERRUPTED" in out.getvalue() and "neuron-build show" not in out.getvalue()
    out = io.StringIO()
    s.print(out, rich=True, width=120)
    table = out.getvalue()
    assert table.count("compile timed out after 120 s") == 1 and table.count("neuron-build show m/b") == 1
    assert "failed target" in table and "6 targets: 1 built, 2 cached" in table


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """A tiny project whose ``other`` model fails to build (its factory raises), with a dodo.py."""
    cfg = write_tiny_project(tmp_path_factory.mktemp("progress") / "proj")
    cfg.write_text(cfg.read_text().replace('factory = "tinylib.other:build"', 'factory = "tinylib.tiny:broken"'))
    (cfg.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    return cfg


def test_build_on_a_terminal_shows_what_compiles_and_one_summary(broken):
    text = in_a_terminal([sys.executable, "-m", "neuron_build.cli", "build", "-n", "2", "-c", str(broken),
                          "other", "tiny/b1/fp32/p1"], cwd=broken.parent)
    plain = SGR.sub("", text)
    assert re.search(r"compiling tiny/b1/fp32/p1 \(\d+ s[,)]", plain), plain[-3000:]
    assert re.search(r"compiling other/static/fp32/p1 \(\d+ s[,)]", plain)
    assert re.search(r"\b[01]/2 done", plain)
    assert re.search(r"\[\d/2\] other/static/fp32/p1 ERROR in \d+\.\d s", plain)
    assert ".  build:" not in plain  # doit's line per task: the live area names it instead
    assert "TaskFailed" not in plain and "UnmetDependency" not in plain  # doit's own report of the failure
    assert "2 targets: 1 built, 0 cached, 1 failed" in plain
    assert plain.count("neuron-build show other/static/fp32/p1") == 1  # the summary's table, once
    lines = plain.splitlines()
    at = [i for i, ln in enumerate(lines) if "log: neuron-build show other/static/fp32/p1" in ln][0]
    row = lines[at - 1]  # the reason's line, the command showing the log below it
    assert "other/static/fp32/p1" in row and "ERROR" in row and "RuntimeError: factory exploded on purpose" in row
    assert plain.count("factory exploded on purpose") == 1  # not also as a `compile failed` log event


def test_a_failure_on_an_80_column_terminal_is_shown_once_its_reason_on_one_line(broken):
    text = in_a_terminal([sys.executable, "-m", "neuron_build.cli", "build", "-c", str(broken), "other"],
                         cwd=broken.parent, columns=80)
    plain = SGR.sub("", text).replace("\r", "")
    assert plain.count("factory exploded on purpose") == 1, plain[-3000:]
    lines = plain.splitlines()
    row = [ln for ln in lines if "factory exploded on purpose" in ln][0]
    assert row.split() == ["other/static/fp32/p1", "│", "ERROR", "│", "RuntimeError:", "factory", "exploded",
                           "on", "purpose"], row
    assert lines[lines.index(row) + 1].split() == ["│", "│", "log:", "neuron-build", "show", "other/static/fp32/p1"]
    assert "compile failed" not in plain
    assert re.search(r"\[1/1\] other/static/fp32/p1 ERROR in \d+\.\d s", plain)
    log = (broken.parent / ".neuron-build" / "build.log").read_text()
    assert '"event": "compile failed"' in log  # the build log still has the event
    assert "\x1b[?25h" in text  # the cursor is shown again when the live area goes


def test_build_through_a_pipe_prints_plain_lines_and_each_failure_once(broken):
    r = run_cli("build", "-n", "2", "-c", str(broken), "other", "tiny/b4/fp32/p1", env={"FORCE_COLOR": ""})
    assert r.returncode == 1
    assert not ANSI.search(r.stdout) and not ANSI.search(r.stderr)
    lines = [ln.split() for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert sorted(ln[0] for ln in lines) == ["[1/2]", "[2/2]"]
    assert sorted((ln[1], ln[2]) for ln in lines) == [("other/static/fp32/p1", "ERROR"), ("tiny/b4/fp32/p1", "PASS")]
    assert r.stdout.count("factory exploded on purpose") == 1 and "TaskFailed" not in r.stdout + r.stderr
    assert r.stdout.count("log: neuron-build show other/static/fp32/p1") == 1
    assert "2 targets: 1 built, 0 cached, 1 failed" in r.stdout


def test_doit_build_prints_the_same_summary(broken):
    assert run_cli("build", "-c", str(broken), "tiny/b1/fp32/p1").returncode == 0  # at least one cached
    r = subprocess.run([sys.executable, "-m", "doit", "-n", "2", "build"], cwd=broken.parent,
                       env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    m = re.search(r"\n9 targets: (\d) built, (\d) cached, 1 failed\n", r.stdout)
    assert m and int(m[1]) + 1 == len(lines) and int(m[1]) + int(m[2]) == 8, r.stdout[-2000:]
    # M is exact from the first line: the 9 selected less those the store holds (its lookup index, asked first)
    done_of = [tuple(map(int, ln.split()[0].strip("[]").split("/"))) for ln in lines]
    assert [n for n, _ in done_of] == list(range(1, len(lines) + 1))
    assert int(m[2]) > 0 and [m_ for _, m_ in done_of] == [len(lines)] * len(lines)
    assert r.stdout.count("factory exploded on purpose") == 1 and "TaskFailed" not in r.stdout
    # nor doit's UnmetDependency report of the group task `build`: its failed targets are in the summary
    assert "UnmetDependency" not in r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("  FAILED other/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose\n"
                                      "    log: neuron-build show other/static/fp32/p1")


NOOP_PROBE = r'''
import sys
from doit.doit_cmd import DoitMain
from doit.cmd_base import DodoTaskLoader
rc = DoitMain(DodoTaskLoader()).run(sys.argv[1:])
print("RICH", "rich" in sys.modules, rc)
'''


def test_a_noop_build_on_a_terminal_does_not_import_rich(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    (cfg.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    assert run_cli("build", "-c", str(cfg), "tiny/b1/fp32/p1").returncode == 0
    text = in_a_terminal([sys.executable, "-c", NOOP_PROBE, "build:tiny/b1/fp32/p1"], cwd=cfg.parent)
    assert "-- build:tiny/b1/fp32/p1" in text and "1 target: 0 built, 1 cached, 0 failed" in text
    assert "RICH False 0" in text
    # the same run with something to compile shows the live area: rich is loaded then
    (cfg.parent / "tinylib" / "act.py").write_text("def scale(x):\n    return x * 3\n")
    text = in_a_terminal([sys.executable, "-c", NOOP_PROBE, "build:tiny/b1/fp32/p1"], cwd=cfg.parent)
    assert re.search(r"compiling tiny/b1/fp32/p1 \(\d+ s[,)]", SGR.sub("", text)) and "RICH True 0" in text


def test_m_of_n_of_m_exact_when_the_targets_to_build_are_known_else_lowered_as_doit_skips():
    exact = BuildDisplay(2, pending={"m/a": 5.0, "m/b": None}, stream=io.StringIO())
    exact.skipped("m/c")   # cached, and known not to need a compile: M stays
    assert exact.total == 2
    exact.skipped("m/b")   # to build, then found built meanwhile
    assert exact.total == 1
    found = BuildDisplay(9, stream=io.StringIO())
    for t in ("m/a", "m/b"):
        found.skipped(t)
    found.started("m/c")
    assert found.total == 7
    for t in ("m/d", "m/e", "m/f", "m/g", "m/h", "m/i"):
        found.skipped(t)
    assert found.total == 1  # never below what started


def test_doit_process_runners_report_progress_and_the_summary_through_doit(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    cfg.write_text(cfg.read_text().replace('factory = "tinylib.other:build"', 'factory = "tinylib.tiny:broken"'))
    (cfg.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    r = subprocess.run([sys.executable, "-m", "doit", "-P", "process", "-n", "2", "build:other/static/fp32/p1",
                        "build:tiny/b1/fp32/p1"], cwd=cfg.parent, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr[-2000:]
    lines = sorted(ln.split()[:3] for ln in r.stderr.splitlines() if ln.startswith("["))
    assert [ln[0] for ln in lines] == ["[1/2]", "[2/2]"]
    assert sorted((ln[1], ln[2]) for ln in lines) == [("other/static/fp32/p1", "ERROR"), ("tiny/b1/fp32/p1", "PASS")]
    assert r.stdout.rstrip().endswith(
        "2 targets: 1 built, 0 cached, 1 failed\n"
        "  FAILED other/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose\n"
        "    log: neuron-build show other/static/fp32/p1")
    assert r.stdout.count("factory exploded on purpose") == 1


def test_the_eta_follows_this_builds_pace_against_the_records():
    # a forced rebuild on a warm machine: each compile takes 0.75 of its recorded time (as the shipped matrix's
    # rebuild did, benchmarks/results/eta_rebuild.json); after the first two finish, what is left is scaled too
    clock = Clock()
    d = BuildDisplay(4, slots=2, expect={"m/a": 40.0, "m/b": 40.0}.get, pending={"m/c": 80.0, "m/d": 80.0},
                     stream=io.StringIO(), live=False, clock=clock)
    d.started("m/a")
    d.started("m/b")
    assert d.eta_s() == 120.0  # 40 + 80 on each slot, as recorded
    clock.t += 30
    d.finished(passed("m/a", 30.0))
    d.finished(passed("m/b", 30.0))
    assert d.eta_s() == pytest.approx(60.0)  # 80 x 0.75 on each slot: what the rebuild really takes, not 80
    d.started("m/c")
    clock.t += 15
    assert d.eta_s() == pytest.approx(60.0)  # m/c 60 - 15 = 45 s on one slot, m/d (not started) 60 s on the other
