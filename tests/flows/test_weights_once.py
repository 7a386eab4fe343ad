"""Weights once (issue 38, item 3), end to end: a model with 2 batch buckets on inductor with ``weights =
"external"`` is built (2 compiles), released, promoted and pulled. The buckets' weights are one blob in the
store, one file on disk in the pulled release (hard links), and one set of tensors in the serving process:
every bucket's AOTInductor package runs on the very tensors ``BucketedModel`` loaded
(``load_constants(..., user_managed=True)``), with outputs equal to the eager model's; a weights file that
does not fit the packages is one error line before anything is loaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow

MODEL = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, hidden)
        self.fc2 = nn.Linear(hidden, 4)
        self.register_buffer("scale", 1.0 + torch.rand(()))

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def build(hidden=16):
    return Net(hidden)
'''

CONFIG = '''
[build]
backend = "inductor"
timeout_s = 900

[profiles.p1]
compiler_args = []
weights = "external"

[models.net]
factory = "once.net:build"
dtypes = ["fp32"]
profiles = ["p1"]
inputs = [{ name = "x", shape = ["batch", 8] }]
buckets = { batch = [1, 2] }
'''


@pytest.fixture(scope="module")
def pulled(tmp_path_factory):
    """(project config, pulled release folder), built, released, promoted to dev (unvalidated) and pulled."""
    root = tmp_path_factory.mktemp("weights-once") / "proj"
    (root / "once").mkdir(parents=True)
    (root / "once" / "__init__.py").write_text("")
    (root / "once" / "net.py").write_text(MODEL)
    cfg = root / "buckets.toml"
    cfg.write_text(textwrap.dedent(CONFIG))

    def cli(*args: str):
        r = run_cli(*args, "-c", str(cfg), cwd=root, timeout=1200)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r
    cli("build")
    rel = json.loads(cli("release", "net", "--json").stdout)
    cli("promote", "net", rel["id"], "--to", "dev", "--allow-unvalidated", "--reason", "weights-once test")
    dest = root.parent / "serve"
    cli("pull", "net", "--channel", "dev", "--dest", str(dest))
    return cfg, dest


def _eager(cfg: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("once_net", cfg.parent / "once" / "net.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.build().eval()


def test_one_weights_blob_in_the_store_and_one_file_in_the_pulled_release(pulled):
    from neuron_build.project.config import load_project
    from neuron_build.workspace import Workspace

    cfg, dest = pulled
    b = Workspace(load_project(cfg))
    manifests = [b.store.manifest(b.store.target(t).key) for t in ("net/b1/fp32/p1", "net/b2/fp32/p1")]
    shas = {m.files["weights.safetensors"].sha256 for m in manifests}
    assert len(shas) == 1                                                    # content-addressed: one blob
    assert manifests[0].files["model.pt2"].sha256 != manifests[1].files["model.pt2"].sha256
    cas = [p for p in (Path(b.store.root) / "cas").rglob("*") if p.is_file()]
    assert [p.name for p in cas].count(shas.pop()) == 1
    release = json.loads((dest / "release.json").read_text())
    files = [dest / b["id"] / "weights.safetensors" for b in release["buckets"]]
    assert len(files) == 2 and len({(os.stat(f).st_dev, os.stat(f).st_ino) for f in files}) == 1  # hard links
    assert os.stat(files[0]).st_nlink >= 2


def test_every_bucket_runs_on_the_same_weights_tensors(pulled):
    import torch

    from neuron_build.runtime import BucketedModel

    cfg, dest = pulled
    bm = BucketedModel.load(dest)
    assert len(bm.weights.loaded) == 1                         # the weights file read once for both buckets
    (state,) = bm.weights.loaded.values()
    assert set(state) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"}
    eager = _eager(cfg)
    x1, x2 = torch.randn(1, 8), torch.randn(2, 8)
    assert torch.allclose(bm(x1), eager(x1), atol=1e-5) and torch.allclose(bm(x2), eager(x2), atol=1e-5)
    state["scale"].mul_(2.0)       # in place, in the one shared tensor: both packages see it (no copies held)
    try:
        assert torch.allclose(bm(x1), 2 * eager(x1), atol=1e-5) and torch.allclose(bm(x2), 2 * eager(x2), atol=1e-5)
    finally:
        state["scale"].div_(2.0)
    assert torch.allclose(bm(x2), eager(x2), atol=1e-5)


def test_a_weights_file_that_does_not_fit_is_one_line_before_any_load(pulled, tmp_path):
    """A wrong-shape weights file, listed in release.json with its own digest (so only the spec can tell):
    AOTInductor would corrupt the heap; BucketedModel refuses it first, naming the file and the fix."""
    import torch
    from safetensors.torch import save_file

    from neuron_build.errors import UserError
    from neuron_build.runtime import BucketedModel

    cfg, dest = pulled
    bad = tmp_path / "bad"
    shutil.copytree(dest, bad, symlinks=True)
    state = {k: v.contiguous() for k, v in _eager(cfg).state_dict().items()}
    state["fc1.bias"] = torch.zeros(32)
    release = json.loads((bad / "release.json").read_text())
    for b in release["buckets"]:
        f = bad / b["id"] / "weights.safetensors"
        f.unlink()
        save_file(state, str(f))
        data = f.read_bytes()
        b["files"][f"{b['id']}/weights.safetensors"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    (bad / "release.json").write_text(json.dumps(release))
    with pytest.raises(UserError) as e:
        BucketedModel.load(bad)
    msg = str(e.value)
    assert "\n" not in msg and "weights.safetensors: weight fc1.bias is F32 [32] but the compiled graph expects F32 " \
                               "[16]; rebuild the artifact or pull the release again" in msg
