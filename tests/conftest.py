"""The fixtures every test may ask for by name: a fresh tiny project, the session's S3 server (a bucket on it, the
AWS variables pointing at it), and the check that no test leaves ``NEURON_BUILD_CONFIG`` changed. Helpers that
are not fixtures live in :mod:`tests.helpers`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.golden import CHANGED, GOLDEN_DIR
from tests.helpers.projects import write_tiny_project
from tests.helpers.s3 import aws_env

#: ``config.stash`` slot of the session's start (seconds since the epoch)
STARTED = pytest.StashKey[float]()


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/*.txt from this run's CLI outputs instead of comparing "
                          "(tests/flows/test_golden.py); review with `git diff tests/golden`")
    parser.addoption("--record-file-seconds", action="store_true", default=False,
                     help="write tests/file_seconds.json (each file's seconds: the order files are handed to the "
                          "workers, longest first) from this run; run the whole suite")


def pytest_configure(config):
    import time

    if config.getoption("--record-file-seconds"):
        _totals["seconds"] = {}
    config.stash[CHANGED] = []
    config.stash[STARTED] = time.time()


def pytest_terminal_summary(terminalreporter, config):
    """After ``--update-golden``: which golden files the run rewrote or removed (or that none changed). Under
    xdist the workers write the files, so the ones written since this session started are read from the
    folder; the removed ones are known only to the process that removed them."""
    if not config.getoption("--update-golden"):
        return
    written = {f"tests/golden/{p.name}" for p in GOLDEN_DIR.glob("*.txt")
               if p.stat().st_mtime >= config.stash[STARTED]}
    changed = sorted(written | set(config.stash.get(CHANGED, [])))
    terminalreporter.write_sep("-", f"--update-golden: {len(changed)} golden file(s) written or removed")
    for name in changed:
        terminalreporter.write_line(f"  {name}")
    if changed:
        terminalreporter.write_line("  review them with `git diff tests/golden`")


#: Each test file's seconds in a full run on 2 cores (setup, call and teardown of its tests), longest first:
#: the order the suite hands files to its workers. Rewrite it with ``pytest --record-file-seconds`` (a full run).
FILE_SECONDS = Path(__file__).parent / "file_seconds.json"


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`FILE_SECONDS`; a file not listed counts as short), each file's tests kept
    together and in order. The suite runs one file per worker (``--dist loadfile --no-loadscope-reorder``,
    pyproject.toml): xdist hands the files out in this order as workers free up, so the long files start early
    and the many short ones fill in at the end, instead of a long file starting last while the other worker
    idles (xdist's own reorder puts the files with the most tests first: the long flows, with one to three
    tests each, went last)."""
    import json

    try:
        seconds = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -float(seconds.get(item.nodeid.split("::")[0], 0)))  # (node ids: as recorded)


def pytest_runtest_logreport(report):
    """With ``--record-file-seconds``: add this phase's seconds to its file (on the controller under xdist)."""
    totals = _totals.get("seconds")
    if totals is not None:
        name = report.nodeid.split("::")[0]
        totals[name] = totals.get(name, 0.0) + report.duration


def pytest_sessionfinish(session):
    """With ``--record-file-seconds``: write :data:`FILE_SECONDS` (files longer than 1 s, longest first)."""
    import json

    totals = _totals.get("seconds")
    if totals and not os.environ.get("PYTEST_XDIST_WORKER"):
        kept = {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1]) if v > 1}
        FILE_SECONDS.write_text(json.dumps(kept, indent=0) + "\n")


_totals: dict[str, dict[str, float]] = {}


@pytest.fixture
def update_golden(request) -> bool:
    """Whether this run rewrites the golden files (``--update-golden``) instead of comparing with them."""
    return request.config.getoption("--update-golden")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """Config path of a fresh tiny project."""
    return write_tiny_project(tmp_path / "proj")


# -- a real S3 endpoint (tests/helpers/s3.py) -----------------------------------------------------------

@pytest.fixture(scope="session")
def s3_server():
    """One moto server for the whole session, on 127.0.0.1 and a free port."""
    from tests.helpers.s3 import S3Server
    srv = S3Server().start()
    yield srv
    srv.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """The session's S3 server, reset (``POST /moto-api/reset``), with the AWS variables pointing at it."""
    s3_server.reset()
    aws_env(monkeypatch, s3_server.url, tmp_path)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh, empty bucket on the session's S3 server; its name."""
    import secrets

    name = f"nb-test-{secrets.token_hex(4)}"
    s3_env.client().create_bucket(Bucket=name)
    return name


@pytest.fixture(autouse=True)
def _no_config_left_set():
    """No test (nor the code it runs in-process) leaves ``NEURON_BUILD_CONFIG`` changed: every later
    subprocess of the same pytest worker would build that project instead of its own."""
    before = os.environ.get("NEURON_BUILD_CONFIG")
    yield
    assert os.environ.get("NEURON_BUILD_CONFIG") == before, "NEURON_BUILD_CONFIG was left changed"
