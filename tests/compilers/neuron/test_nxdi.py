"""Text-generation models on backend = "neuron" through NxDI, against the test double in tests/fakes/nxdi
(its NeuronConfig, LlamaInferenceConfig, NeuronLlamaForCausalLM.compile, which runs the neuronx-cc double
per bucket): the exact NeuronConfig and compile calls, the artifact's files, the compiler args recorded per
bucket, a compile failure classified, and tp_degree in the key."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from neuron_build.project.config import load_project
from neuron_build.project.keys import KeyMaker
from neuron_build.project.matrix import expand
from tests.fakes.env import neuron_env
from tests.helpers import textgen as textgen_kit
from tests.helpers.cli import REPO, run_cli

NXDI_ROOT = REPO / "tests" / "fakes" / "nxdi"

EXTRA = 'decode_buckets = [32, 64]'


def nxdi_env(tmp_path: Path, **switches) -> dict:
    env = neuron_env("neuron_sdk", calls=tmp_path / "cc-calls.jsonl", log_format="summary", **switches)
    env["PYTHONPATH"] = os.pathsep.join([str(NXDI_ROOT), env.get("PYTHONPATH", "")])
    env["FAKE_NXDI_CALLS"] = str(tmp_path / "nxdi-calls.jsonl")
    return env


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    cfg = textgen_kit.write_project(tmp_path / "proj", backend="neuron", gpt2=False,
                                    llama_buckets="{ batch = [1], seq = [16, 32] }", extra=EXTRA)
    text = cfg.read_text().replace('device = "cpu"', 'target = "trn1"').replace('dtypes = ["fp32"]', 'dtypes = ["bf16"]')
    cfg.write_text(text.replace("compiler_args = []", "compiler_args = []\ntp_degree = 2"))
    return cfg


NEURON_CONFIG = {"tp_degree": 2, "batch_size": 1, "seq_len": 64, "max_context_length": 32, "enable_bucketing": True,
                 "context_encoding_buckets": [16, 32], "token_generation_buckets": [32, 64],
                 "torch_dtype": "bfloat16", "on_device_sampling_config": {"do_sample": False, "top_k": 1},
                 "logical_nc_config": 1, "save_sharded_checkpoint": True}


def test_one_nxdi_target_per_batch_with_the_neuron_config_and_tp_degree_in_its_key(proj):
    p = load_project(proj)
    (t,) = expand(p)
    assert t.id == "llama/nxdi-b1/bf16/p1" and t.graph == "nxdi"
    ki = KeyMaker(p, environ={}).key(t)
    assert ki.details["inputs"]["neuron_config"] == NEURON_CONFIG
    assert ki.details["compiler"]["tp_degree"] == 2
    proj.write_text(proj.read_text().replace("tp_degree = 2", "tp_degree = 8"))
    k8 = KeyMaker(load_project(proj), environ={}).key(t)
    assert k8.key != ki.key and k8.details["inputs"]["neuron_config"]["tp_degree"] == 8


def test_nxdi_compile_calls_files_and_compiler_args(proj, tmp_path):
    env = nxdi_env(tmp_path)
    r = run_cli("build", "-c", str(proj), cwd=proj.parent, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    calls = [json.loads(x) for x in (tmp_path / "nxdi-calls.jsonl").read_text().splitlines()]
    assert [c["call"] for c in calls] == ["NeuronConfig", "compile", "shard_weights"]
    assert calls[0]["kwargs"] == {**{k: v for k, v in NEURON_CONFIG.items()},
                                  "on_device_sampling_config": {"do_sample": False, "top_k": 1, "top_p": 1.0,
                                                                "temperature": 1.0, "dynamic": False,
                                                                "deterministic": False, "global_topk": 256}}
    assert calls[1]["app"] == "NeuronLlamaForCausalLM" and calls[1]["dry_run"] is False
    assert calls[1]["model_path"] == str(proj.parent / "hf-llama")
    m = json.loads(run_cli("show", "llama/nxdi-b1/bf16/p1", "--json", "-c", str(proj), cwd=proj.parent, env=env).stdout)
    assert (m["backend"], m["metrics"]["status"]) == ("neuron", "PASS")
    assert {"model.pt", "neuron_config.json"} <= set(m["files"])
    nx = m["compiler"]["nxdi"]
    assert nx["application"].endswith("modeling_llama.NeuronLlamaForCausalLM")
    assert sorted(nx["compiler_args"]) == ["context_encoding_model/_tp0_bk0", "context_encoding_model/_tp0_bk1",
                                           "token_generation_model/_tp0_bk0", "token_generation_model/_tp0_bk1"]
    cte = nx["compiler_args"]["context_encoding_model/_tp0_bk0"]
    tkg = nx["compiler_args"]["token_generation_model/_tp0_bk1"]
    assert cte[:4] == ["--framework", "XLA", "--target", "trn1"]
    assert "-O1" in cte and "-O2" in tkg and "--lnc=1" in cte and "--verbose=35" in tkg
    assert "--tensorizer-options=--enable-ccop-compute-overlap --cc-pipeline-tiling-factor=1 --vectorize-strided-dma " in tkg
    cc = [json.loads(x) for x in (tmp_path / "cc-calls.jsonl").read_text().splitlines()]
    assert len(cc) == 4  # one neuronx-cc compile per bucket
    # the compiled folder is the artifact: NxDI's own config, as compile() saved it
    store = proj.parent / "artifacts"
    sha = m["files"]["neuron_config.json"]["sha256"]
    (blob,) = [p for p in store.rglob(sha) if p.is_file()]
    saved = json.loads(blob.read_text())["neuron_config"]
    assert saved["tp_degree"] == 2 and saved["context_encoding_buckets"] == [16, 32]
    assert saved["token_generation_buckets"] == [32, 64] and saved["torch_dtype"] == "bfloat16"


def test_nxdi_compile_failure_is_classified(proj, tmp_path):
    env = nxdi_env(tmp_path, fail="xcg815")
    r = run_cli("build", "-c", str(proj), cwd=proj.parent, env=env)
    assert r.returncode == 1
    f = json.loads(run_cli("failures", "--json", "-c", str(proj), cwd=proj.parent, env=env).stdout)
    rows = f.get("failures") or f.get("records") or f.get("targets")
    (row,) = [x for x in rows if x["target"] == "llama/nxdi-b1/bf16/p1"]
    assert row["status"] == "ERROR" and "XCG815" in row["reason"]


# ---------------------------------------------------------------------------------------------------
# serving: a pulled NxDI release through NxDI's own class and generation adapter (issue 30 item 7)

@pytest.fixture
def pulled(proj, tmp_path):
    """The NxDI llama (batch 1, context buckets 16 and 32, seq_len 64) built, released, promoted to dev
    (not validated: this host has no NeuronCore) and pulled."""
    env = nxdi_env(tmp_path)
    r = run_cli("build", "-c", str(proj), cwd=proj.parent, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rel = json.loads(run_cli("release", "llama", "--json", "-c", str(proj), cwd=proj.parent, env=env).stdout)
    r = run_cli("promote", "llama", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "no NeuronCore here",
                "-c", str(proj), cwd=proj.parent, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    dest = tmp_path / "serve"
    r = run_cli("pull", "llama", "--channel", "dev", "--dest", str(dest), "-c", str(proj), cwd=proj.parent, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"dest": dest, "release": rel, "env": env}


def no_neuron_line(where: str) -> str:
    return (f"{where}: an NxDI release of llama (backend neuron, trn1) runs only on a Neuron host and this host "
            f"has no NeuronCore (no /dev/neuron*); serve, validate and bench it on a trn1 instance with at least 2 "
            f"NeuronCores (tp_degree 2)")


def test_an_nxdi_release_on_a_host_without_neuroncores_is_one_line_naming_the_host(pulled, proj, tmp_path):
    """Loading, warming up, validating and benchmarking an NxDI release here say which host it needs; never
    'pull the release again' (which cannot help)."""
    from neuron_build.errors import UserError
    from neuron_build.runtime import BucketedModel

    dest = pulled["dest"]
    with pytest.raises(UserError) as e:
        BucketedModel.load(dest)
    assert str(e.value) == no_neuron_line(str(dest / "release.json"))
    r = run_cli("warmup", str(dest), cwd=tmp_path, env=pulled["env"])
    assert r.returncode == 2 and "pull" not in r.stderr
    assert r.stderr.strip().endswith(no_neuron_line(str(dest / "release.json"))), r.stderr
    r = run_cli("validate", "--json", "-c", str(proj), cwd=proj.parent, env=pulled["env"])
    (rec,) = json.loads(r.stdout)["records"]
    assert r.returncode == 0 and (rec["verdict"], rec["reason"]) == ("not_validated", "no NeuronCore here")
    r = run_cli("bench", "-c", str(proj), cwd=proj.parent, env=pulled["env"])
    assert r.returncode == 0 and "SKIPPED  llama/nxdi-b1/bf16/p1: no NeuronCore here" in r.stderr, r.stderr


def double_tokens(prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """What the NxDI double generates (its next_token rule), written out here."""
    out, last, done = [], prompt[-1], False
    for step in range(n):
        tok = eos if done else (last * 7 + step + 3) % 1000
        out.append(tok)
        done = done or tok == eos
        last = tok
    return out


def test_an_nxdi_release_on_a_neuron_host_is_served_by_nxdi_class_and_adapter(pulled, monkeypatch, tmp_path):
    """On a Neuron host (device nodes and the runtime imitated), BucketedModel.load calls
    NeuronLlamaForCausalLM(path) and .load(path) on the pulled bucket folder, and generate goes through
    HuggingFaceGenerationAdapter.generate: a batch of 3 runs as three calls of the batch-1 application."""
    import torch

    from neuron_build.project import toolchain
    from neuron_build.runtime import BucketedModel
    from tests.fakes.env import activate

    activate(monkeypatch, "neuron_sdk", has_device=True)
    monkeypatch.syspath_prepend(str(NXDI_ROOT))
    calls = tmp_path / "serve-calls.jsonl"
    monkeypatch.setenv("FAKE_NXDI_CALLS", str(calls))
    monkeypatch.setattr(toolchain, "neuron_devices", lambda: ["/dev/neuron0"])
    dest = pulled["dest"]
    bm = BucketedModel.load(dest)
    (app, adapter), = bm.textgen.apps.values()
    assert type(app).__name__ == "NeuronLlamaForCausalLM" and app.model_path == str(dest / "nxdi-b1")
    assert type(adapter).__name__ == "HuggingFaceGenerationAdapter" and bm.device == "neuron"
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    got = bm.generate(ids, max_new_tokens=4)
    assert got.tolist() == [r + double_tokens(r, 4) for r in ids.tolist()]
    log = [json.loads(x) for x in calls.read_text().splitlines()]
    # Cls(path) reads neuron_config.json (NeuronConfig rebuilt from it), .load(path), the adapter, its generates
    assert [c["call"] for c in log] == ["NeuronConfig", "load", "load_weights", "adapter"] + ["generate", "reset"] * 3
    assert log[0]["kwargs"]["batch_size"] == 1 and log[0]["kwargs"]["tp_degree"] == 2
    assert log[1]["compiled_model_path"] == str(dest / "nxdi-b1") and log[2]["source"] == "weights/"
    assert {(tuple(c["shape"]), c["max_new_tokens"], c["min_new_tokens"], c["do_sample"]) for c in log
            if c["call"] == "generate"} == {((1, 3), 4, 4, False)}
    # eos: a row that meets it stops there, as the adapter (transformers' generate) pads it
    eos = double_tokens([5, 6, 7], 4)[1]
    got = bm.generate(ids[:1], max_new_tokens=4, eos_token_id=eos)
    assert got.tolist() == [[5, 6, 7] + double_tokens([5, 6, 7], 2)]
    from neuron_build.compilers.textgen_serve import GenerateError

    with pytest.raises(GenerateError, match="a prompt of 33 tokens is longer than every context-encoding bucket"):
        bm.generate(torch.ones(1, 33, dtype=torch.long), max_new_tokens=2)


def test_validate_and_bench_of_an_nxdi_target_on_a_neuron_host_run_through_nxdi(pulled, proj, monkeypatch, tmp_path,
                                                                                request):
    """On a Neuron host (imitated) validation and the benchmark load the compiled folder with NxDI's class
    and adapter instead of reading text-generation files it does not have (which ended in 'pull the release
    again' or a bare FileNotFoundError). The double's tokens are not the model's, so the verdict is a real
    fail with the first differing token; the benchmark's callable returns NxDI's first new token."""
    import torch

    from neuron_build.build.builder import Builder
    from neuron_build.evaluate import validate as validate_mod
    from neuron_build.evaluate import validate_run
    from neuron_build.evaluate.textgen_validate import bench_callables
    from neuron_build.project import toolchain
    from neuron_build.workspace import Workspace
    from tests.fakes.env import activate

    activate(monkeypatch, "neuron_sdk", has_device=True)
    monkeypatch.syspath_prepend(str(NXDI_ROOT))
    calls = tmp_path / "validate-calls.jsonl"
    monkeypatch.setenv("FAKE_NXDI_CALLS", str(calls))
    monkeypatch.setattr(toolchain, "neuron_devices", lambda: ["/dev/neuron0"])
    monkeypatch.setattr(validate_mod, "neuron_devices", lambda: ["/dev/neuron0"])
    # versions another test of this process cached (another toolchain) must not make another key
    toolchain.clear_caches()
    request.addfinalizer(toolchain.clear_caches)
    b = Builder(Workspace(load_project(proj)))
    (t,) = b.ws.targets
    key = b.ws.key(t).key
    # the imitated Neuron host (the patched device list) lives in this process: validate here, not in the fresh
    # process validate_target starts (tests/flows/test_one_verdict.py covers that process)
    monkeypatch.setattr(validate_mod, "_validate_isolated", validate_run.validate_here)
    rec = validate_mod.validate_target(b.ws.project, b.ws.store, t, key, record=False, keys=b.ws.keys)
    assert rec["verdict"] == "fail" and rec["partners"] == ["llama/nxdi-b1/bf16/p1"]
    assert [r["name"] for r in rec["outputs"]] == ["generate b1 prompt 16 +8 tokens", "generate b1 prompt 32 +8 tokens"]
    assert rec["reason"] == ("llama/nxdi-b1/bf16/p1: generate b1 prompt 16 +8 tokens: tokens differ from the eager "
                             "generate() from new token 0 on")
    assert rec["measure"].startswith("NxDI (tokens only")
    log = [json.loads(x)["call"] for x in calls.read_text().splitlines()]
    assert log[:4] == ["NeuronConfig", "load", "load_weights", "adapter"] and log.count("generate") == 2
    compiled, _eager, (ids, pos) = bench_callables(b.ws.project, b.ws.store, t, key, b.ws.store.manifest(key))
    assert ids.shape == (1, 32)
    assert compiled(ids, pos).tolist() == [(int(ids[0, -1]) * 7 + 3) % 1000]
    assert torch.equal(compiled(ids, pos), compiled(ids, pos))
