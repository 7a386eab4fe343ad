"""NxDI per-bucket reuse (issue 31, item 2) against the NxDI double: libneuronxla's persistent cache, owned by the
store and restored into a stable work directory, makes a graph-neutral edit run neuronx-cc 0 times, a new seq
bucket compile that bucket only, and another host that fetched the store compile nothing; the manifest says per
bucket whether it compiled or came from the cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.compilers.neuron.test_nxdi import nxdi_env
from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import run_cli

TARGET = "llama/nxdi-b1/bf16/p1"
BUCKETS = ["context_encoding_model/_tp0_bk0", "context_encoding_model/_tp0_bk1",
           "token_generation_model/_tp0_bk0", "token_generation_model/_tp0_bk1"]


def project(root: Path, remote: Path) -> Path:
    cfg = textgen_kit.write_project(root, backend="neuron", gpt2=False,
                                    llama_buckets="{ batch = [1], seq = [16, 32] }", extra="decode_buckets = [32, 64]")
    text = cfg.read_text().replace('device = "cpu"', f'target = "trn1"\nremote = "file://{remote}"')
    cfg.write_text(text.replace('dtypes = ["fp32"]', 'dtypes = ["bf16"]'))
    return cfg


def compiles(tmp_path: Path) -> int:
    f = tmp_path / "cc-calls.jsonl"
    return len(f.read_text().splitlines()) if f.exists() else 0


def build(cfg: Path, env: dict) -> dict:
    r = run_cli("build", "-c", str(cfg), cwd=cfg.parent, env=env, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads(run_cli("show", TARGET, "--json", "-c", str(cfg), cwd=cfg.parent, env=env).stdout)
    return m


def sources(m: dict) -> dict[str, str]:
    return {b: v["source"] for b, v in m["compiler"]["nxdi"]["buckets"].items()}


@pytest.mark.slow
def test_nxdi_persistent_cache_owned_by_the_store(tmp_path):
    env = nxdi_env(tmp_path)
    remote = tmp_path / "remote"
    cfg = project(tmp_path / "host-a" / "proj", remote)
    m = build(cfg, env)
    assert compiles(tmp_path) == 4 and sources(m) == dict.fromkeys(BUCKETS, "compiled")
    assert any(n.startswith("neuron-cache/neuronxcc-2.30.4217.0+5e1f0c2a/MODULE_") and n.endswith("/model.neff")
               for n in m["files"])

    # new weights (NxDI's NEFFs hold none): relinked with the stored NEFFs, neuronx-cc runs 0 times
    # (tests/compilers/neuron/test_nxdi_weights.py)
    textgen_kit.save_llama(cfg.parent / "hf-llama", seed=1)
    m2 = build(cfg, env)
    assert m2["key"] != m["key"] and m2["relinked_from"] == m["key"]
    assert compiles(tmp_path) == 4 and m2["files"]["model.pt"] == m["files"]["model.pt"]

    # a new seq bucket: that bucket compiles, the others come from the cache
    cfg.write_text(cfg.read_text().replace("seq = [16, 32]", "seq = [16, 32, 48]"))
    m3 = build(cfg, env)
    assert compiles(tmp_path) == 5
    assert sources(m3) == {**dict.fromkeys(BUCKETS, "cache"), "context_encoding_model/_tp0_bk2": "compiled"}

    # push, then another host (its own checkout path, its own local store) fetches and compiles nothing
    r = run_cli("push", "-c", str(cfg), cwd=cfg.parent, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(p.name.endswith(".json") for p in (remote / "neuron-cache").rglob("*"))
    host_b = tmp_path / "host-b" / "checkout"
    shutil.copytree(cfg.parent, host_b, ignore=shutil.ignore_patterns("artifacts", ".doit*"))
    cfg_b = host_b / "buckets.toml"
    textgen_kit.save_llama(host_b / "hf-llama", seed=2)  # and another graph-neutral edit there
    r = run_cli("fetch", "-c", str(cfg_b), cwd=host_b, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    m4 = build(cfg_b, {**env, "NEURON_BUILD_GRAPH_KEY": "0"})  # traced again (no relink): every NEFF a cache hit
    assert m4["key"] != m3["key"] and compiles(tmp_path) == 5
    assert set(sources(m4).values()) == {"cache"}


def test_a_tampered_cache_entry_is_left_out(tmp_path):
    """An entry whose NEFF does not match the artifact's manifest is not restored (a miss, never a wrong NEFF)."""
    from neuron_build.compilers.neuron import nxdi_cache
    from neuron_build.store import neuron_cache

    class Files:
        def __init__(self, sha):
            self.sha256 = sha

    class Man:
        files = {"neuron-cache/neuronxcc-1/MODULE_a+b/model.neff": Files("0" * 64),
                 "neuron-cache/neuronxcc-1/MODULE_a+b/model.done": Files(
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
                 "neuron-cache/neuronxcc-1/MODULE_c+d/model.neff": Files(
                     "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"),
                 "neuron-cache/neuronxcc-1/MODULE_c+d/model.done": Files(
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
                 "neuron-cache/../../etc/x/y": Files("0" * 64)}

    src = tmp_path / "artifact"
    for name in Man.files:
        if ".." not in name:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / "neuron-cache/neuronxcc-1/MODULE_a+b/model.neff").write_bytes(b"tampered")
    (src / "neuron-cache/neuronxcc-1/MODULE_a+b/model.done").write_bytes(b"")
    (src / "neuron-cache/neuronxcc-1/MODULE_c+d/model.neff").write_bytes(b"foo")
    (src / "neuron-cache/neuronxcc-1/MODULE_c+d/model.done").write_bytes(b"")
    key = "a" * 64

    class Store:
        objects: dict = {}

        def get_object(self, path):
            return self.objects.get(path)

        def put_object(self, path, data, create_only=False):
            self.objects[path] = data
            return True

        def manifest(self, k):
            return Man() if k == key else None

        def artifact_dir(self, k):
            return src

    store = Store()
    neuron_cache.record(store, "1", "m/b/fp32/p", key)
    assert nxdi_cache.CACHE_FILES == neuron_cache.ARTIFACT_FOLDER
    got = neuron_cache.restore(store, "m/b/fp32/p", "1", tmp_path / "cache")
    assert got == {"from": key, "entries": 1, "dropped": 1}
    assert nxdi_cache.entries(tmp_path / "cache") == {
        "neuronxcc-1/MODULE_c+d": "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"}
    assert not (tmp_path / "etc").exists()
    assert neuron_cache.restore(store, "m/b/fp32/p", "2", tmp_path / "other") == {"from": None, "entries": 0,
                                                                               "dropped": 0}
