"""NxDI's weights apart from its NEFFs (issue 38, items 2 and 4), against the NxDI double in tests/fakes/nxdi:
an NxDI release carries the sharded checkpoint (``weights/``) and is served on a host without the build host's
checkpoint folder; a shard that does not fit its spec is one line before NxDI loads anything; a fine-tune (new
values, same config and tensors) is sharded and published with the stored NEFFs (no trace, no neuronx-cc run);
a changed config, tensor dtype or name, or an unreadable checkpoint compiles."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path

import pytest

from tests.compilers.neuron.test_nxdi import NXDI_ROOT, double_tokens, nxdi_env, proj, pulled  # noqa: F401
from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import run_cli

TID = "llama/nxdi-b1/bf16/p1"
SHARDS = ["weights/tp0_sharded_checkpoint.safetensors", "weights/tp1_sharded_checkpoint.safetensors"]


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _build(project: Path, env: dict, tmp_path: Path, ok: bool = True) -> dict:
    """One build; what it ran: neuronx-cc compiles, NxDI calls (their names), the ledger's compiles and reuses."""
    cc, nx = tmp_path / "cc-calls.jsonl", tmp_path / "nxdi-calls.jsonl"
    n_cc, n_nx = len(_lines(cc)), len(_lines(nx))

    def counts():
        return json.loads(run_cli("report", "--json", "-c", str(project), cwd=project.parent, env=env).stdout)
    before = counts()
    r = run_cli("build", "-c", str(project), cwd=project.parent, env=env)
    assert (r.returncode == 0) == ok, r.stdout[-3000:] + r.stderr[-3000:]
    after = counts()
    return {"neuronx_cc": len(_lines(cc)) - n_cc, "nxdi": [c["call"] for c in _lines(nx)[n_nx:]],
            "compiles": after["compiles"] - before["compiles"], "relinked": after["graph_reused"] - before["graph_reused"],
            "log": r.stdout + r.stderr}


def _manifest(project: Path, env: dict) -> dict:
    m = json.loads(run_cli("show", TID, "--json", "-c", str(project), cwd=project.parent, env=env).stdout)
    return m.get("manifest", m)


def _on_a_neuron_host(monkeypatch, tmp_path: Path) -> Path:
    from neuron_build.project import toolchain
    from tests.fakes.env import activate

    activate(monkeypatch, "neuron_sdk", has_device=True)
    monkeypatch.syspath_prepend(str(NXDI_ROOT))
    calls = tmp_path / "serve-calls.jsonl"
    monkeypatch.setenv("FAKE_NXDI_CALLS", str(calls))
    monkeypatch.setattr(toolchain, "neuron_devices", lambda: ["/dev/neuron0"])
    return calls


def test_a_pulled_nxdi_release_serves_without_the_checkpoint_folder_and_a_bad_shard_is_one_line(
        pulled, proj, monkeypatch, tmp_path):  # noqa: F811
    """The release holds weights/tp{rank}_sharded_checkpoint.safetensors (tp_degree 2) and their spec; with the
    build host's checkpoint folder moved away, NxDI loads them from the pulled folder and generates; a shard
    of another shape, a missing one, or a spec that does not name every rank is one line, and NxDI's load()
    is never called."""
    import torch

    from neuron_build.errors import UserError
    from neuron_build.runtime import BucketedModel

    dest = pulled["dest"]
    folder = dest / "nxdi-b1"
    assert sorted(str(p.relative_to(folder)) for p in (folder / "weights").iterdir()) == SHARDS
    spec = json.loads((folder / "weights.json").read_text())
    assert sorted(spec["files"]) == SHARDS
    assert spec["files"][SHARDS[0]]["layers.0.mlp.up_proj.weight"] == {"dtype": "bfloat16", "shape": [64, 64]}
    cfg = json.loads((folder / "neuron_config.json").read_text())
    assert cfg["neuron_config"]["save_sharded_checkpoint"] is True
    shutil.move(str(proj.parent / "hf-llama"), str(tmp_path / "elsewhere"))   # the build host's checkpoint: gone
    assert not Path(cfg["_name_or_path"]).exists()

    calls = _on_a_neuron_host(monkeypatch, tmp_path)
    bm = BucketedModel.load(dest)
    loaded = [c for c in _lines(calls) if c["call"] == "load_weights"]
    assert [c["source"] for c in loaded] == ["weights/"]
    got = bm.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3)
    assert got.tolist() == [[5, 6, 7] + double_tokens([5, 6, 7], 3)]

    from safetensors.torch import load_file, save_file
    shard = folder / SHARDS[1]
    good = shard.read_bytes()
    state = load_file(str(shard))
    state["layers.0.mlp.up_proj.weight"] = torch.zeros(32, 64, dtype=torch.bfloat16)
    shard.unlink()  # (a pulled file may be a link into the store: never write through it)
    save_file(state, str(shard))
    n = len(_lines(calls))
    with pytest.raises(UserError) as e:   # a pulled release: its files are checked against release.json
        BucketedModel.load(dest)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{shard}: ")
    # the folders validation and bench load from the store: the shards against the spec, before NxDI's load()
    from neuron_build.compilers.neuron.nxdi_serve import nxdi_engine
    from neuron_build.runtime import read_pulled

    release = read_pulled(dest, "pull it")
    engine = partial(nxdi_engine, [folder], release.model, release.backend, release.hardware_target, "here")
    with pytest.raises(UserError) as e:
        engine()
    assert str(e.value) == (f"{shard}: weight layers.0.mlp.up_proj.weight is BF16 [32, 64] but the compiled graph "
                            "expects BF16 [64, 64]; rebuild the artifact or pull the release again")
    shard.unlink()
    with pytest.raises(UserError, match="cannot be read"):
        engine()
    shard.write_bytes(good)
    spec["files"].pop(SHARDS[1])
    (folder / "weights.json").unlink()
    (folder / "weights.json").write_text(json.dumps(spec))
    with pytest.raises(UserError, match="the spec does not name the 2 sharded weights files"):
        engine()
    assert "load" not in [c["call"] for c in _lines(calls)[n:]]   # nothing reached NxDI's load()


def test_a_fine_tune_is_sharded_and_relinked_with_the_stored_neffs(proj, monkeypatch, tmp_path):  # noqa: F811
    """New checkpoint values, same config and tensors: the worker shards the new checkpoint (NxDI's
    shard_weights) and the builder publishes it with the stored model.pt: no NxDI compile() (no trace), no
    neuronx-cc run; the manifest records relinked_from, explain says so, and the artifact serves the new
    weights."""
    env = nxdi_env(tmp_path)
    cold = _build(proj, env, tmp_path)
    assert (cold["neuronx_cc"], cold["compiles"], cold["relinked"]) == (4, 1, 0)
    first = _manifest(proj, env)
    assert first["compiler"]["weights"] == "external" and sorted(first["compiler"]["nxdi"]["weights"]) == SHARDS

    textgen_kit.save_llama_checkpoint(proj.parent / "hf-llama", seed=1)   # the fine-tune
    fine = _build(proj, env, tmp_path)
    assert (fine["neuronx_cc"], fine["compiles"], fine["relinked"]) == (0, 0, 1), fine["log"][-3000:]
    assert "compile" not in fine["nxdi"] and "shard_weights" in fine["nxdi"]
    m = _manifest(proj, env)
    assert m["relinked_from"] == first["key"] and m["key"] != first["key"]
    assert m["files"]["model.pt"] == first["files"]["model.pt"]
    assert all(m["files"][s]["sha256"] != first["files"][s]["sha256"] for s in SHARDS)
    e = run_cli("explain", TID, "-c", str(proj), cwd=proj.parent, env=env)
    assert f"weights changed, graph unchanged: relinked from {first['key']}" in e.stdout, e.stdout

    from neuron_build.compilers.neuron.nxdi_serve import nxdi_engine
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    store = Workspace(load_project(proj)).store
    calls = _on_a_neuron_host(monkeypatch, tmp_path)
    for key in (first["key"], m["key"]):
        nxdi_engine([store.artifact_dir(key)], "llama", "neuron", "trn1", f"key {key}")
    old, new = (c["digest"] for c in _lines(calls) if c["call"] == "load_weights")
    assert old != new
    from neuronx_distributed_inference.models.llama.modeling_llama import NeuronLlamaForCausalLM

    app = NeuronLlamaForCausalLM(str(store.artifact_dir(m["key"])))
    app.config._name_or_path = str(proj.parent / "hf-llama")   # shard the fine-tune directly: the same weights
    app.neuron_config.save_sharded_checkpoint = False
    app.load(str(store.artifact_dir(m["key"])))
    assert _lines(calls)[-1]["digest"] == new


def _retensor(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    f = folder / "model.safetensors"
    state = load_file(str(f))
    edit(state)
    f.unlink()
    save_file(state, str(f), metadata={"format": "pt"})


def test_what_the_structure_does_not_cover_compiles(proj, tmp_path):  # noqa: F811
    """Fail closed: a changed config value, a tensor of another dtype, a renamed tensor: NxDI's compile()
    runs (traced, no relink); an unreadable checkpoint has no graph key and its compile fails (NxDI cannot
    shard it), never a relink."""
    import torch

    env = nxdi_env(tmp_path)
    hf = proj.parent / "hf-llama"
    assert _build(proj, env, tmp_path)["compiles"] == 1
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 1e-5}))
    got = _build(proj, env, tmp_path)
    assert (got["compiles"], got["relinked"], got["nxdi"][:2]) == (1, 0, ["NeuronConfig", "compile"])
    _retensor(hf, lambda s: s.update({"model.norm.weight": s["model.norm.weight"].to(torch.float16)}))
    got = _build(proj, env, tmp_path)
    assert (got["compiles"], got["relinked"], got["nxdi"][:2]) == (1, 0, ["NeuronConfig", "compile"])
    _retensor(hf, lambda s: s.update({"model.norm.scale": s.pop("model.norm.weight")}))
    got = _build(proj, env, tmp_path)
    assert (got["compiles"], got["relinked"], got["nxdi"][:2]) == (1, 0, ["NeuronConfig", "compile"])
    assert _manifest(proj, env).get("relinked_from") is None
    (hf / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    got = _build(proj, env, tmp_path, ok=False)   # the compile is tried (and fails sharding): never a relink
    assert (got["compiles"], got["relinked"], got["nxdi"]) == (1, 0, ["NeuronConfig", "compile", "shard_weights"])
    f = json.loads(run_cli("failures", "--json", "-c", str(proj), cwd=proj.parent, env=env).stdout)
    (row,) = [x for x in (f.get("failures") or f.get("records") or f.get("targets")) if x["target"] == TID]
    assert row["status"] == "ERROR", row


def test_the_structure_key_reads_the_checkpoint_nxdi_reads_and_serving_checks_before_load(tmp_path, monkeypatch):
    """The structure: the config without _name_or_path, the tensors' names, dtypes and shapes from the
    safetensors NxDI's load_state_dict reads (model.safetensors, else the index's files); the layout option or
    a checkpoint without those files means no key. Serving an artifact without shards needs the checkpoint
    folder it names: one line when it is not here."""
    import torch
    from safetensors.torch import save_file

    from neuron_build.compilers.graph_key import NoGraphKey
    from neuron_build.compilers.neuron import nxdi_weights

    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}, str(ck / "model.safetensors"))
    cfg = {"_name_or_path": str(ck), "hidden_size": 64, "neuron_config": {"tp_degree": 2}}
    doc = nxdi_weights.structure_document(cfg, "m.App", ck)
    assert doc["checkpoint"] == [["a", "float32", [2, 3]], ["b", "bfloat16", [4]]]
    assert "_name_or_path" not in doc["config"] and doc["config"]["hidden_size"] == 64
    moved = tmp_path / "moved"
    shutil.copytree(ck, moved)
    assert nxdi_weights.structure_document({**cfg, "_name_or_path": str(moved)}, "m.App", moved) == doc
    (moved / "model.safetensors").rename(moved / "part-1.safetensors")
    (moved / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "part-1.safetensors",
                                                                                   "b": "part-1.safetensors"}}))
    assert nxdi_weights.structure_document(cfg, "m.App", moved)["checkpoint"] == doc["checkpoint"]
    (moved / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
    with pytest.raises(NoGraphKey, match="names no files"):
        nxdi_weights.structure_document(cfg, "m.App", moved)
    (moved / "model.safetensors.index.json").unlink()
    with pytest.raises(NoGraphKey, match="holds no model.safetensors"):
        nxdi_weights.structure_document(cfg, "m.App", moved)
    with pytest.raises(NoGraphKey, match="quantized or LoRA"):
        nxdi_weights.structure_document({**cfg, "neuron_config": {"quantized": True}}, "m.App", ck)
    monkeypatch.setenv(nxdi_weights.LAYOUT_ENV, "cpu")
    with pytest.raises(NoGraphKey, match="NXD_LAYOUT_TRANSFORMATION_OPTIONS"):
        nxdi_weights.structure_document(cfg, "m.App", ck)

    art = tmp_path / "art"
    art.mkdir()
    old = {"_name_or_path": str(tmp_path / "gone"), "neuron_config": {"tp_degree": 2}}
    why = nxdi_weights.serve_problem(art, old)
    assert why.startswith(f"{art / 'neuron_config.json'}: this NxDI artifact holds no sharded weights") and "\n" not in why
    assert nxdi_weights.serve_problem(art, {**old, "_name_or_path": str(ck)}) is None
    new = {"neuron_config": {"tp_degree": 2, "save_sharded_checkpoint": True}}
    assert "the spec does not name the 2 sharded weights files" in nxdi_weights.serve_problem(art, new)
    (art / "weights").mkdir()
    for r in range(2):
        save_file({"a": torch.zeros(1, 3)}, str(art / "weights" / f"tp{r}_sharded_checkpoint.safetensors"))
    assert nxdi_weights.write_spec(art) == SHARDS
    assert nxdi_weights.serve_problem(art, new) is None
