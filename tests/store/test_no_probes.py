"""No caller outside ``neuron_build.store`` probes a store implementation: what a caller needs to know
(read-only, the remote, pending pushes, the tiers, the folder, the logs) is part of the contract
(:class:`neuron_build.store.contract.Tiers`), so every store answers it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from neuron_build.store import LocalStore, contract
from neuron_build.store.remote import RemoteStore
from neuron_build.store.tiered import ReadThroughStore

PKG = Path(__file__).resolve().parents[2] / "neuron_build"
#: getattr/hasattr on something named like a store, isinstance/type checks against a store class (not an
#: error class such as ReadOnlyStore)
PROBE = re.compile(r"(getattr|hasattr)\([^,()]*store[^,()]*,|isinstance\([^)]*\b(LocalStore|RemoteStore|ReadThroughStore|ArtifactStore|Store)\b|type\([^)]*store[^)]*\)\s*(is|==)")


def probes() -> list[str]:
    out = []
    for f in sorted(PKG.rglob("*.py")):
        if f.is_relative_to(PKG / "store"):
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if PROBE.search(line):
                out.append(f"{f.relative_to(PKG.parent)}:{n}: {line.strip()}")
    return out


def test_no_caller_outside_the_store_package_probes_an_implementation():
    assert probes() == []


def test_the_probe_pattern_finds_what_callers_used_to_write():
    for line in ('x = getattr(b.store, "remote", None)', 'if hasattr(self.store, "log_file"):',
                 "if not isinstance(b.store, LocalStore):", "isinstance(store, ReadThroughStore)"):
        assert PROBE.search(line), line


@pytest.mark.parametrize("kind", ["local", "remote", "read-through"])
def test_every_store_answers_the_tiers(kind, tmp_path):
    local = LocalStore(tmp_path / "here")
    remote = RemoteStore(f"memory://probes-{tmp_path.name}", cache_dir=tmp_path / "cache")
    store = {"local": local, "remote": remote, "read-through": ReadThroughStore(local, remote)}[kind]
    assert isinstance(store, contract.Tiers) and isinstance(store, contract.ArtifactStore)
    assert store.read_only is False and store.push_failures == [] and store.pending() == set()
    assert store.push_pending() == []
    assert store.remote_location == (remote.location if kind == "read-through" else None)
    assert store.remote_tier is (remote if kind == "read-through" else None)
    assert store.local_tier is (remote if kind == "remote" else local)
    assert store.folder == (None if kind == "remote" else local.root)
