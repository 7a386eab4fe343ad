"""Golden outputs of the everyday commands: one session on the tiny project (build a few targets, one of them
failing at its factory; a no-op rebuild; plan, status, ls, explain, show, failures, report; validate, release,
promote, a refused promotion, channels, history, releases, verify; a configuration error), each command's
stdout, stderr and exit code normalised (tests/helpers/golden.py) and compared with ``tests/golden/<name>.txt``.

A mismatch fails with a unified diff. To accept a changed output:
``pytest tests/flows/test_golden.py --update-golden``, then review ``git diff tests/golden``.

The session runs once per module, in a fixed order, whichever tests are selected: four compiles in all
(``-n 1``, so stderr's log events come in one order; ``heartbeat_s`` is an hour, so no "still compiling" event
depends on the machine's speed)."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.helpers.cli import REPO, run_cli
from tests.helpers.golden import CHANGED, GOLDEN_DIR, check_golden, normaliser_for, transcript
from tests.helpers.projects import edit, write_tiny_project

#: a third model whose factory raises (tinylib.tiny:broken): the failed target of the session
BROKEN_MODEL = '''
[models.bad]
factory = "tinylib.tiny:broken"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = [1, 16] }]
'''
#: what the session builds: tiny's two fp32/p1 buckets, other's one target; ``bad`` fails
GOOD = ("tiny/b*/fp32/p1", "other/*")
#: the environment of every command: no colour, a fixed width, UTC; nothing of the caller's neuron-build setup
ENV = {"NO_COLOR": "1", "COLUMNS": "120", "LINES": "50", "TZ": "UTC",
       "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
UNSET = ("FORCE_COLOR", "CLICOLOR_FORCE", "TERM", *(k for k in os.environ if k.startswith("NEURON_BUILD_")))

#: the golden files this session writes, in the order it runs them
NAMES = ["build", "build_noop", "plan", "status", "ls", "explain", "show", "failures", "report", "validate",
         "release", "promote", "promote_refused", "channels", "history", "releases", "verify", "config_error"]


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> dict[str, str]:
    """The normalised transcript of each command of the session, by golden name."""
    root = tmp_path_factory.mktemp("golden") / "proj"
    cfg = write_tiny_project(root, extra=BROKEN_MODEL)
    edit(cfg, "heartbeat_s = 1", "heartbeat_s = 3600")
    wrong = root / "missing-profile.toml"
    wrong.write_text(cfg.read_text())
    edit(wrong, 'factory = "tinylib.other:build"\ndtypes = ["fp32"]\nprofiles = ["p1"]',
         'factory = "tinylib.other:build"\ndtypes = ["fp32"]\nprofiles = ["p9"]')
    normalise = normaliser_for(root)
    out: dict[str, str] = {}

    def run(name: str, *args: str) -> str:
        r = run_cli(*args, cwd=root, env=ENV, unset=UNSET, timeout=300)
        out[name] = transcript(args, r.returncode, r.stdout, r.stderr, normalise)
        return r.stdout

    run("build", "build", "-n", "1", *GOOD, "bad/*")
    run("build_noop", "build", "-n", "1", *GOOD)
    run("plan", "plan")
    run("status", "status")
    run("ls", "ls")
    run("explain", "explain", "tiny/b1/fp32/p1")
    run("show", "show", "tiny/b1/fp32/p1")
    run("failures", "failures")
    run("report", "report")
    run("validate", "validate", GOOD[0])
    released = re.search(r"^release (r-[0-9a-f]+):", run("release", "release", "tiny", "--dtype", "fp32",
                                                         "--profile", "p1"), re.M)
    rid = released.group(1) if released else "r-none"
    run("promote", "promote", "tiny", rid, "--to", "dev", "--reason", "golden session")
    run("promote_refused", "promote", "tiny", rid, "--to", "prod")
    run("channels", "channels")
    run("history", "history", "tiny", "--channel", "dev")
    run("releases", "releases", "tiny")
    run("verify", "verify")
    run("config_error", "-c", "missing-profile.toml", "plan")
    assert list(out) == NAMES
    return out


@pytest.mark.parametrize("name", NAMES)
def test_output_matches_its_golden_file(session, name, update_golden, request):
    if check_golden(name, session[name], update_golden):
        request.config.stash[CHANGED].append(f"tests/golden/{name}.txt")


def test_every_golden_file_belongs_to_a_command_of_the_session(update_golden, request):
    stale = sorted(p for p in GOLDEN_DIR.glob("*.txt") if p.stem not in NAMES)
    if update_golden:
        for p in stale:
            p.unlink()
            request.config.stash[CHANGED].append(f"tests/golden/{p.name} (removed)")
        return
    assert not stale, (f"golden files no command of the session writes: {[p.name for p in stale]}; "
                       "run pytest tests/flows/test_golden.py --update-golden to remove them")


def test_the_normaliser_numbers_keys_by_first_appearance_and_keeps_the_rest(tmp_path):
    full = "893b1c0f2f2309dd3fea45e69b791a0f207d47c47bd18822c70dc13d7cd368ca"
    other = "5fe10dad12ea"
    text = (f"cached  {full[:12]}  {tmp_path}/artifacts/logs/{full}\n"
            f"{other}  r-feb37a66de069ab6  {full}  3.5 s,  233 MiB  2026-12-01T23:06:41+00:00  1m05s ago\n"
            f"failures/x/20261201T230645.136331Z-d4d8de4d  at most 400 s\n")
    out = normaliser_for(tmp_path)(text)
    assert out == ("cached  <KEY1>  <PROJECT>/artifacts/logs/<KEY1>\n"
                   "<KEY2>  <R1>  <KEY1>  <S>,  <MiB>  <TIME>  <AGE> ago\n"
                   "failures/x/<STAMP>  at most 400 s\n")
    # a JSON log line: its varying fields by name, its keys numbered like the text's
    line = json.dumps({"target": "t", "key": other, "compile_time_s": 3.49, "peak_rss_mb": 233, "timestamp": "x"})
    assert normaliser_for(tmp_path)(line) == ('{"target": "t", "key": "<KEY1>", "compile_time_s": "<S>", '
                                              '"peak_rss_mb": "<MiB>", "timestamp": "<TIME>"}')
