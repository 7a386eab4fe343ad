"""Reuse a user can trust, as a careful user tries it: weights a factory loads by native code (safetensors'
``load_file`` and ``safe_open``, ``torch.from_file``, transformers' ``from_pretrained`` of a project folder)
are inputs, so new weights make the target missing; and a second checkout without pip's metadata, sharing a
remote, downloads every artifact (no compile, no graph capture). Real torchscript compiles of tiny models."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.project.config import load_project
from neuron_build.status import DOWNLOADED, BuildResult
from neuron_build.workspace import Workspace
from tests.helpers.projects import write_tiny_project

LOADERS = {
    "lf": ("ckpt/lf.safetensors", "from safetensors.torch import load_file\n\n"
           "def weights(path):\n    return load_file(path)['w']\n"),
    "so": ("ckpt/so.safetensors", "from safetensors import safe_open\n\n"
           "def weights(path):\n    with safe_open(path, framework='pt') as f:\n        return f.get_tensor('w')\n"),
    "ff": ("ckpt/ff.bin", "import torch\n\n"
           "def weights(path):\n    return torch.from_file(path, size=4, dtype=torch.float32).clone()\n"),
}
FACTORY = '''
import os
import torch
from native.{name}_load import weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Scale(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return x * self.w


def build():
    return Scale(weights(os.path.join(ROOT, "{path}")))
'''
HF_FACTORY = '''
import os
import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Logits(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids, use_cache=False).logits


def build():
    return Logits(AutoModelForCausalLM.from_pretrained(os.path.join(ROOT, "ckpt", "gpt2")).eval())
'''


def write_weights(root: Path, name: str, value: float) -> None:
    import torch
    from safetensors.torch import save_file

    path = root / LOADERS[name][0]
    path.parent.mkdir(parents=True, exist_ok=True)
    w = torch.full((4,), value)
    if path.suffix == ".safetensors":
        save_file({"w": w}, str(path))
    else:
        path.write_bytes(w.numpy().tobytes())


def native_project(root: Path) -> Path:
    (root / "native").mkdir(parents=True)
    (root / "native" / "__init__.py").write_text("")
    models = ""
    for name, (path, loader) in LOADERS.items():
        (root / "native" / f"{name}_load.py").write_text(loader)
        (root / "native" / f"{name}.py").write_text(FACTORY.format(name=name, path=path))
        write_weights(root, name, 1.0)
        models += textwrap.dedent(f'''
            [models.{name}]
            factory = "native.{name}:build"
            dtypes = ["fp32"]
            profiles = ["p1"]
            inputs = [{{ name = "x", shape = [2, 4] }}]
            ''')
    from tests.helpers.textgen import save_gpt2
    save_gpt2(root / "ckpt" / "gpt2")
    (root / "native" / "hfm.py").write_text(HF_FACTORY)
    models += textwrap.dedent('''
        [models.hfm]
        factory = "native.hfm:build"
        dtypes = ["fp32"]
        profiles = ["p1"]
        inputs = [{ name = "input_ids", shape = [1, 8], dtype = "int64", range = [0, 1000] }]
        ''')
    cfg = root / "buckets.toml"
    cfg.write_text('[build]\nbackend = "torchscript"\ntimeout_s = 600\n\n[profiles.p1]\ncompiler_args = []\n' + models)
    return cfg


def states(cfg: Path) -> dict[str, tuple[str, list[str]]]:
    b = Builder(Workspace(load_project(cfg)))
    out = {t.model: (str(b.ws.state(t)), b.ws.changed(t)[0]) for t in b.ws.targets}
    b.ws.keys.save()
    return out


@pytest.mark.slow
def test_weights_loaded_by_native_code_are_keyed_by_content(tmp_path):
    cfg = native_project(tmp_path / "proj")
    root = cfg.parent
    b = Builder(Workspace(load_project(cfg)))
    outs = [b.build(t) for t in b.ws.targets]
    assert [(o.target, o.ok) for o in outs] == [(t.id, True) for t in b.ws.targets]  # (same graphs: reused)
    b.ws.keys.save()
    assert {m: s for m, (s, _) in states(cfg).items()} == dict.fromkeys(["lf", "so", "ff", "hfm"], "cached")

    for name, (path, _) in LOADERS.items():
        write_weights(root, name, 2.0)  # new weights, same shapes: a stale artifact would answer x * 1
        got = states(cfg)
        assert got[name] == ("missing", [f"recorded read {path} changed"]), name
        assert all(s == "cached" for m, (s, _) in got.items() if m != name), got
        write_weights(root, name, 1.0)
        assert states(cfg)[name] == ("cached", [])

    from tests.helpers.textgen import save_gpt2
    save_gpt2(root / "ckpt" / "gpt2", seed=1)  # other random weights, the same config.json
    got = states(cfg)
    assert got["hfm"] == ("missing", ["recorded read ckpt/gpt2/model.safetensors changed"])


def test_a_second_checkout_without_pip_metadata_downloads_everything(tmp_path):
    """Package metadata read while the factory runs (``importlib.metadata`` over the project folder, as an
    editable install's ``*.egg-info`` is) is no input: a copy of the project without it, sharing the remote,
    plans the same keys and downloads every artifact, with no compile and no graph capture."""
    shared = (tmp_path / "shared").as_uri()
    a = write_tiny_project(tmp_path / "a")
    text = a.read_text().replace('heartbeat_s = 1\n', f'heartbeat_s = 1\nremote = "{shared}"\n', 1)
    a.write_text(text.replace('dtypes = ["fp32", "bf16"]', 'dtypes = ["fp32"]'))
    tiny = a.parent / "tinylib" / "tiny.py"
    tiny.write_text(tiny.read_text().replace(
        "def build(width: int = 16):\n",
        "def build(width: int = 16):\n    import importlib.metadata\n    importlib.metadata.entry_points()\n"))
    info = a.parent / "demo.egg-info"  # what `pip install -e .` leaves in a checkout
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[console_scripts]\ndemo = demo:main\n")

    b = Builder(Workspace(load_project(a)))
    outs = [b.build(t) for t in b.ws.targets]
    assert all(o.ok and o.compiled for o in outs), [(o.target, o.status, o.reason) for o in outs]
    b.ws.keys.save()

    second = tmp_path / "b"
    shutil.copytree(a.parent, second, ignore=shutil.ignore_patterns("*.egg-info", "artifacts", ".neuron-build"))
    b2 = Builder(Workspace(load_project(second / "buckets.toml")))
    assert [b2.ws.key(t).key for t in b2.ws.targets] == [b.ws.key(t).key for t in b.ws.targets]
    outs2 = [b2.build(t) for t in b2.ws.targets]
    assert [(o.status, o.reason, o.compiled) for o in outs2] == [(BuildResult.CACHED, DOWNLOADED, False)] * len(outs)


@pytest.mark.slow
def test_weights_in_a_hidden_or_linked_project_folder_are_keyed(tmp_path):
    """A checkpoint the factory loads from a hidden folder of the project (``.weights/``) or through a folder
    the project links to (``link -> /data/ckpt``, as large checkpoints are kept) is a project file like any
    other: new weights make the target missing, instead of the old artifact staying ``cached``."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path / "proj"
    (root / "native").mkdir(parents=True)
    (root / "native" / "__init__.py").write_text("")
    (root / "native" / "lf_load.py").write_text(LOADERS["lf"][1])
    (tmp_path / "data").mkdir()
    (root / "link").symlink_to(tmp_path / "data", target_is_directory=True)
    paths = {"hid": ".weights/w.safetensors", "sym": "link/w.safetensors"}
    models = ""
    for name, path in paths.items():
        (root / "native" / f"{name}.py").write_text(FACTORY.format(name="lf", path=path))
        models += (f'\n[models.{name}]\nfactory = "native.{name}:build"\ndtypes = ["fp32"]\nprofiles = ["p1"]\n'
                   f'inputs = [{{ name = "x", shape = [2, 4] }}]\n')

    def write(path: str, value: float) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.full((4,), value)}, str(root / path))

    for path in paths.values():
        write(path, 1.0)
    cfg = root / "buckets.toml"
    cfg.write_text('[build]\nbackend = "torchscript"\ntimeout_s = 600\n\n[profiles.p1]\ncompiler_args = []\n' + models)
    b = Builder(Workspace(load_project(cfg)))
    assert all(b.build(t).ok for t in b.ws.targets)
    b.ws.keys.save()
    assert states(cfg) == {"hid": ("cached", []), "sym": ("cached", [])}
    for name, path in paths.items():
        write(path, 2.0)  # new weights, same shapes: a stale artifact would answer x * 1
        assert states(cfg)[name] == ("missing", [f"recorded read {path} changed"]), name
