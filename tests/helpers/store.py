"""Building blocks of store tests: two keys, files to publish, an artifact published the way the builder does,
and a project whose ``[build]`` table gains a line."""

from __future__ import annotations

import hashlib
from pathlib import Path

from neuron_build.status import Status
from neuron_build.store import ArtifactStore
from neuron_build.store.manifest import Manifest, Metrics

KEY_A = "a1" * 32


KEY_B = "b2" * 32


def entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def manifest(key: str, files: dict[str, bytes], status: str = Status.PASS, target: str = "m/b1/fp32/p",
             logs: dict[str, bytes] | None = None) -> Manifest:
    """A manifest listing ``files`` (and ``logs``) by sha256 and size."""
    return Manifest(
        key=key, target=target, model="m", bucket={"batch": 1}, dtype="fp32", profile="p", backend="torchscript",
        hardware_target="cpu", key_details={}, component_hashes={},
        files={n: entry(b) for n, b in files.items()}, logs={n: entry(b) for n, b in (logs or {}).items()},
        metrics=Metrics(status=status, compile_time_s=1.5, op_count=3, op_count_source="test",
                        artifact_bytes=sum(map(len, files.values()))),
        toolchain={"torch": "0"}, created="2026-12-01T00:00:00+00:00", host="test")


def publish(store: ArtifactStore, key: str, files: dict[str, bytes], logs: dict[str, bytes] | None = None,
            **kw) -> Path:
    """Stage, seal and publish an artifact the way the builder does."""
    folder = store.new_staging(key) / "object"
    folder.mkdir()
    for name, data in {**files, **(logs or {})}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    store.seal(folder, manifest(key, files, logs=logs, **kw))
    return store.publish(folder, key)


FILES = {"model.pt": b"weights" * 100, "model.neff": b"neff bytes\n", "sub/extra.bin": b"\x00\x01"}



OTHER = "other/static/fp32/p1"


def with_build(cfg: Path, line: str) -> Path:
    """``cfg`` with ``line`` added first under ``[build]``."""
    cfg.write_text(cfg.read_text().replace("[build]\n", f"[build]\n{line}\n", 1))
    return cfg

