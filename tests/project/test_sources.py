"""Holes in the key, one per way people lay out model code: each edit must make the target stale, with
``explain`` naming the file (or variable) that changed; what does not change the artifact must not.

Most tests mark a target built by publishing a placeholder artifact under its key (what the no-op
benchmark does: the key and the state are what is tested, not the compiler); the recorded-import test runs
a real (torchscript) compile, because only the worker sees a module loaded by a string.
"""

from __future__ import annotations

import os
import shutil
import socket
import textwrap
from pathlib import Path

import pytest

from neuron_build.build.builder import Builder
from neuron_build.cli.inspect import format_explain
from neuron_build.errors import ConfigError
from neuron_build.project.config import load_project
from neuron_build.status import TargetState
from neuron_build.store.manifest import Manifest, Metrics
from neuron_build.store.records import TargetRecord
from neuron_build.util import file_sha256
from neuron_build.workspace import Workspace
from tests.helpers.projects import edit

OTHER = "other/static/fp32/p1"


def mark_built(cfg: Path, target_id: str = OTHER) -> Builder:
    """Publish a placeholder artifact and a target record for the target's current key."""
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id[target_id]
    ki = b.ws.key(t)
    st = b.ws.store.new_staging(ki.key)
    obj = st / "object"
    obj.mkdir()
    (obj / "model.pt").write_bytes(b"placeholder " + ki.key.encode())
    files = {"model.pt": {"sha256": file_sha256(obj / "model.pt"), "size": (obj / "model.pt").stat().st_size}}
    m = Manifest(key=ki.key, target=t.id, model=t.model, bucket=dict(t.bucket), dtype=t.dtype, profile=t.profile,
                 backend=b.ws.keys.backend, hardware_target=b.ws.keys.hardware_target, key_details=ki.details,
                 component_hashes=ki.hashes, files=files,
                 metrics=Metrics(status="PASS", compile_time_s=0.001, op_count=1, op_count_source="test"),
                 toolchain=ki.details["toolchain"], created="2026-01-01T00:00:00+00:00", host=socket.gethostname())
    b.ws.store.seal(obj, m)
    b.ws.store.publish(obj, ki.key)
    shutil.rmtree(st, ignore_errors=True)
    b.ws.store.put_target(TargetRecord(target=t.id, key=ki.key, status="PASS", details=ki.details, hashes=ki.hashes))
    b.ws.keys.save()
    assert Workspace(load_project(cfg)).state(t) == TargetState.CACHED
    return b


def state_and_explain(cfg: Path, target_id: str = OTHER) -> tuple[str, list[str]]:
    """The target's state in a fresh planner and the ``explain`` lines that say what changed."""
    b = Builder(Workspace(load_project(cfg)))
    t = b.ws.by_id[target_id]
    lines = [ln.strip() for ln in format_explain(b.ws, t).splitlines() if ln.strip().startswith("- ")]
    b.ws.keys.save()
    return str(b.ws.state(t)), lines


def use_factory(cfg: Path, factory: str, extra: str = "") -> None:
    edit(cfg, 'factory = "tinylib.other:build"', f'factory = "{factory}"' + (f"\n{extra}" if extra else ""))


def test_edited_package_init_along_the_factory_path(tiny):
    root = tiny.parent
    (root / "zoo" / "vision").mkdir(parents=True)
    (root / "zoo" / "__init__.py").write_text("TORCH_SEED = 1\n")
    (root / "zoo" / "vision" / "__init__.py").write_text("")
    (root / "zoo" / "vision" / "lin.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(16, 3)\n")
    use_factory(tiny, "zoo.vision.lin:build")
    mark_built(tiny)
    (root / "zoo" / "__init__.py").write_text("import torch\ntorch.manual_seed(2)\n")  # runs before lin.py
    assert state_and_explain(tiny) == ("missing", ["- model: sources.zoo/__init__.py"])


def test_edited_helper_beside_buckets_toml(tiny):
    root = tiny.parent
    (root / "helpers.py").write_text("WIDTH = 3\n")
    (root / "tinylib" / "withhelper.py").write_text(
        "import torch\nimport helpers\n\ndef build():\n    return torch.nn.Linear(16, helpers.WIDTH)\n")
    use_factory(tiny, "tinylib.withhelper:build")
    mark_built(tiny)
    (root / "helpers.py").write_text("WIDTH = 4\n")
    assert state_and_explain(tiny) == ("missing", ["- model: sources.helpers.py"])


def test_relative_and_star_imports(tiny):
    root = tiny.parent
    (root / "tinylib" / "parts").mkdir()
    (root / "tinylib" / "parts" / "__init__.py").write_text('__all__ = ["norm"]\n')
    (root / "tinylib" / "parts" / "norm.py").write_text("EPS = 1e-6\n")
    (root / "tinylib" / "rel.py").write_text(
        "import torch\nfrom .parts import *\nfrom . import act\n\n"
        "def build():\n    return torch.nn.Linear(16, 3)\n")
    use_factory(tiny, "tinylib.rel:build")
    mark_built(tiny)
    (root / "tinylib" / "parts" / "norm.py").write_text("EPS = 1e-5\n")  # imported by `from .parts import *`
    assert state_and_explain(tiny) == ("missing", ["- model: sources.tinylib/parts/norm.py"])
    mark_built(tiny)
    (root / "tinylib" / "act.py").write_text("def scale(x):\n    return x\n")  # `from . import act`
    assert state_and_explain(tiny) == ("missing", ["- model: sources.tinylib/act.py"])


def test_sources_globs_escape_hatch(tiny):
    root = tiny.parent
    (root / "kernels").mkdir()
    (root / "kernels" / "gelu.cl").write_text("kernel v1\n")
    use_factory(tiny, "tinylib.other:build", 'sources = ["kernels/*.cl"]')
    mark_built(tiny)
    (root / "kernels" / "gelu.cl").write_text("kernel v2\n")
    assert state_and_explain(tiny) == ("missing", ["- model: sources.kernels/gelu.cl"])
    edit(tiny, 'sources = ["kernels/*.cl"]', 'sources = ["kernels/*.cu"]')
    with pytest.raises(ConfigError, match=r"models\.other\.sources\[0\]: 'kernels/\*\.cu' matches no file"):
        load_project(tiny)


def test_module_loaded_by_string_is_recorded(tiny):
    root = tiny.parent
    (root / "tinylib" / "plugin.py").write_text("OUT = 3\n")
    (root / "tinylib" / "bystring.py").write_text(textwrap.dedent('''
        import importlib
        import torch

        def build():
            plugin = importlib.import_module("tinylib." + "plug" + "in")
            return torch.nn.Linear(16, plugin.OUT)
    '''))
    use_factory(tiny, "tinylib.bystring:build")
    b = Builder(Workspace(load_project(tiny)))
    out = b.build(b.ws.by_id[OTHER])
    assert out.ok, out.reason
    assert list(b.ws.store.manifest(out.key).recorded_inputs["imports"]) == ["tinylib/plugin.py"]
    # the manifest records what the compile imported: the next plan finds the artifact (a no-op)
    assert state_and_explain(tiny) == ("cached", [])
    (root / "tinylib" / "plugin.py").write_text("OUT = 4\n")
    assert state_and_explain(tiny) == ("missing", ["- recorded import tinylib/plugin.py changed"])


def test_logging_variables_are_not_in_the_key(tiny, monkeypatch):
    mark_built(tiny)
    for var, value in (("PYTORCH_JIT_LOG_LEVEL", ">>ir_emitter"), ("TORCH_LOGS", "+dynamo"),
                       ("TORCH_COMPILE_DEBUG", "1"), ("NEURON_RT_LOG_LEVEL", "DEBUG"),
                       ("TORCHINDUCTOR_CACHE_DIR", "/tmp/elsewhere")):
        monkeypatch.setenv(var, value)
    assert state_and_explain(tiny) == ("cached", [])
    monkeypatch.setenv("PYTORCH_JIT", "0")  # this one changes what torchscript produces
    assert state_and_explain(tiny) == ("missing", ["- env: PYTORCH_JIT"])


def test_weights_rewritten_in_place_with_mtime_restored(tiny):
    w = tiny.parent / "w.bin"
    w.write_bytes(b"weights-v1" * 100)
    use_factory(tiny, "tinylib.other:build", 'weights = ["w.bin"]')
    mark_built(tiny)
    st = w.stat()
    with open(w, "r+b") as f:  # same size, same inode
        f.write(b"WEIGHTS-v2")
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (w.stat().st_size, w.stat().st_mtime_ns, w.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert state_and_explain(tiny) == ("missing", ["- model: weights.w.bin"])


def test_folder_of_weights(tiny):
    ckpt = tiny.parent / "ckpt"
    (ckpt / "shards").mkdir(parents=True)
    (ckpt / "shards" / "b.safetensors").write_bytes(b"b1")
    (ckpt / "a.safetensors").write_bytes(b"a1")
    (ckpt / ".lock").write_text("")
    use_factory(tiny, "tinylib.other:build", 'weights = ["ckpt"]')
    b = mark_built(tiny)
    weights = b.ws.key(b.ws.by_id[OTHER]).details["model"]["weights"]
    assert list(weights) == ["ckpt/a.safetensors", "ckpt/shards/b.safetensors"]  # stable order, no hidden files
    (ckpt / "shards" / "b.safetensors").write_bytes(b"b2")
    assert state_and_explain(tiny) == ("missing", ["- model: weights.ckpt/shards/b.safetensors"])


def test_weights_outside_the_project_keyed_by_content(tiny, tmp_path):
    for d in ("mnt1", "mnt2"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "w.bin").write_bytes(b"same bytes")
    use_factory(tiny, "tinylib.other:build", f'weights = ["{tmp_path / "mnt1" / "w.bin"}"]')
    b1 = Builder(Workspace(load_project(tiny)))
    k1 = b1.ws.key(b1.ws.by_id[OTHER])
    assert list(k1.details["model"]["weights"]) == ["<outside>/w.bin"]
    edit(tiny, str(tmp_path / "mnt1"), str(tmp_path / "mnt2"))
    b2 = Builder(Workspace(load_project(tiny)))
    assert b2.ws.key(b2.ws.by_id[OTHER]).key == k1.key


def test_missing_weights_and_empty_folder_messages(tiny):
    (tiny.parent / "empty").mkdir()
    use_factory(tiny, "tinylib.other:build", 'weights = ["nope.bin", "empty"]')
    with pytest.raises(ConfigError) as e:
        load_project(tiny)
    text = str(e.value)
    assert "models.other.weights[0]: 'nope.bin' not found" in text
    assert "models.other.weights[1]: folder 'empty' holds no files" in text
    assert "'empty' not found" not in text
