"""The fixtures of the build tests: a real one-node Slurm on this host."""

from __future__ import annotations

import pytest

from tests.helpers.slurm import LocalSlurm


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm on this host (as root, no systemd; :class:`tests.helpers.slurm.LocalSlurm`), for one
    test module; stopped, its jobs cancelled, after it."""
    s = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        s.start()
        yield s
    finally:
        s.stop()
