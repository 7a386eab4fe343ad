"""Building blocks of release tests: the tiny project's release config, a picky model that fails one bucket,
releases made through the builder, validation and benchmark records put beside them, and the gates read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.release import (
    PromotionRefused,
    create_release,
    promote,
)
from neuron_build.store import layout
from neuron_build.store.local import LocalStore
from neuron_build.workspace import Workspace
from tests.helpers.projects import manifest_file, rewrite_manifest

ACTOR = "tester@ci"


PICKY = '''
import torch
from torch import nn


class Picky(nn.Module):
    """Fails to trace at batch 4, so one bucket of two fails to build."""

    def forward(self, x):
        if x.shape[0] == 4:
            raise RuntimeError("picky: batch 4 is not supported on purpose")
        return x * 3


def build():
    return Picky()
'''


PICKY_CONFIG = '''
[models.picky]
factory = "tinylib.picky:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 16] }]
buckets = { batch = [1, 4] }
'''


def set_release_config(cfg: Path, text: str) -> None:
    cfg.write_text(cfg.read_text() + "\n[release]\n" + text + "\n")


def ctx(cfg: Path):
    project = load_project(cfg)
    b = Builder(Workspace(project))
    return project, b, b.ws.store, project.config.release


def make(cfg: Path, dtype: str = "fp32", profile: str = "p1") -> dict:
    _, b, _, _ = ctx(cfg)
    return create_release(b.ws, "tiny", dtype, profile).to_json()  # the record, as the store holds it


def validate_all(store: LocalStore, rel: dict, kind: str = "cpu", verdict: str = "pass") -> None:
    for a in rel["artifacts"]:
        store.put_result(a["key"], "validation", kind, {"verdict": verdict, "reason": None,
                                                           "device_kind": kind, "outputs": []})


def bench_all(store: LocalStore, rel: dict, median_ms: float, kind: str = "cpu", session: str = "s1") -> None:
    """Benchmark records of one session: 101 samples spread +-2 % around ``median_ms``, one call in ten
    20x slower (a busy host's tail, which the gate must ignore)."""
    samples = [median_ms * (0.98 + 0.04 * i / 100) * (20 if i % 10 == 3 else 1) for i in range(101)]
    for a in rel["artifacts"]:
        store.put_result(a["key"], "bench", f"{kind}--hostA", {
            "format": 2, "device_kind": kind, "host": "hostA", "host_class": "x86_64 test x2", "session": session,
            "settings": {"threads": 1, "timing": "interleaved with eager", "warmup": 5, "sync": "none (cpu)"},
            "latency_ms": {"p50": median_ms, "p99": max(samples)}, "samples_ms": samples,
            "throughput_per_s": 1000 / median_ms, "iters": len(samples), "time": "2026-01-01T00:00:00+00:00"})


def gate(entry, name: str) -> dict:
    """The gate ``name`` of a promotion: a :class:`HistoryEntry` (what ``promote`` returns) or its JSON."""
    return next(g for g in (entry["gates"] if isinstance(entry, dict) else entry.gates) if g["name"] == name)


def refused(store, settings, to, **kw) -> dict:
    with pytest.raises(PromotionRefused) as ei:
        promote(store, settings, "tiny", to, **kw)
    return ei.value.entry | {"message": str(ei.value)}


def tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def blob_of(store: LocalStore, rel: dict, i: int, name: str = "model.pt") -> Path:
    return store.path(layout.blob_path(rel["artifacts"][i]["files"][name]["sha256"]))


def rebuilt_with(proj: Path, torch_version: str) -> None:
    """Make every stored artifact of the project say it was built with ``torch_version``."""

    _, _, store, _ = ctx(proj)
    for key in store.keys():
        rewrite_manifest(manifest_file(store, key),
                         lambda m: m["toolchain"].update(torch=torch_version))

