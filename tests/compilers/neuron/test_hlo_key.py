"""The HLO graph key of the XLA path (neuron_build.compilers.neuron.hlo_key) against the torch_neuronx double:
stable across processes, checkout paths and work directories; sensitive to what the NEFF or model.pt depends on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.env import activate, neuron_env

REPO = Path(__file__).resolve().parents[3]

MODEL = '''\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=8, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.up = nn.Linear(d, 16)
        self.down = nn.Linear(16, d)

    def forward(self, x):
        h = torch.relu(self.up(x))
        return x + self.down(h) * 2.0
'''

SCRIPT = '''\
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from blockmod import Block
from torch_neuronx.xla_impl import trace as xt
from neuron_build.compilers.neuron import hlo_key
x = torch.randn(2, 8)
art = xt.generate_hlo(Block(), (x,), inline_weights_to_neff=True, cpu_backend=True)
doc = hlo_key.hlo_document(art, ["--optlevel=2", "--target", "trn1", f"--logfile={sys.argv[2]}/log-neuron-cc.txt",
                                 "--verbose", "35"], True, "2.30")
print(json.dumps({"doc": doc, "raw": art.hlo_module.SerializeToString().decode(),
                  "name": art.hlo_module.name, "meta": [[i.metadata.source_file, i.metadata.source_line]
                  for i in art.hlo_module.computations[0].instructions if i.metadata.op_type]}))
'''


def _lower_in_process(folder: Path, workdir: Path) -> dict:
    env = neuron_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO)])
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(workdir)], env=env,
                       capture_output=True, text=True, cwd=folder, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def test_two_processes_two_checkouts_two_workdirs_give_one_graph_key(tmp_path):
    """The lowering differs in bytes (module name, ids, metadata with the checkout's path and lines), the
    canonical document does not."""
    a, b = tmp_path / "checkout-a", tmp_path / "elsewhere" / "checkout-b"
    for d in (a, b):
        d.mkdir(parents=True)
    (a / "blockmod.py").write_text(MODEL)
    (b / "blockmod.py").write_text("# a comment that moves every source line\n\n" + MODEL.replace(
        "h = torch.relu", "# why: a comment\n        h = torch.relu"))
    one, two = _lower_in_process(a, tmp_path / "w1"), _lower_in_process(b, tmp_path / "w2")
    assert one["raw"] != two["raw"] and one["name"] != two["name"]
    assert one["meta"] != two["meta"] and one["meta"][0][0] == str(a / "blockmod.py")
    assert one["doc"] == two["doc"]
    assert "--logfile" not in json.dumps(one["doc"]["flags"]) and one["doc"]["flags"] == [
        "--optlevel=2", "--target", "trn1"]


@pytest.fixture
def xt(monkeypatch):
    activate(monkeypatch)
    from torch_neuronx.xla_impl import trace
    return trace


def _doc(xt, model, inline=True, args=("--target", "trn1"), version="2.30"):
    import torch

    from neuron_build.compilers.neuron import hlo_key
    torch.manual_seed(5)
    art = xt.generate_hlo(model, (torch.randn(2, 8),), inline_weights_to_neff=inline, cpu_backend=True)
    return hlo_key.hlo_document(art, list(args), inline, version)


def _block(seed=0, act="relu", scale=2.0):
    import torch

    class B(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 8)

        def forward(self, x):
            return x + self.down(getattr(torch, act)(self.up(x))) * scale
    return B()


def test_the_document_changes_with_the_graph_the_weights_the_flags_and_the_compiler(xt):
    base = _doc(xt, _block())
    assert _doc(xt, _block()) == base                                         # a second lowering, same process
    assert _doc(xt, _block(act="tanh"))["module"] != base["module"]           # an activation change
    assert _doc(xt, _block(scale=3.0))["module"] != base["module"]            # a constant in the code
    w = _doc(xt, _block(seed=1))
    assert w["module"] == base["module"] and w["inlined_weights"] != base["inlined_weights"]  # an inlined weight
    ext = _doc(xt, _block(), inline=False)
    assert ext["inlined_weights"] == base["inlined_weights"] and ext["external_weights"]
    assert _doc(xt, _block(seed=1), inline=False)["external_weights"] != ext["external_weights"]
    assert _doc(xt, _block(), args=("--target", "trn1", "--optlevel=3"))["flags"] != base["flags"]
    assert _doc(xt, _block(), args=("--target", "trn1", "--logfile=/x/y.txt", "--verbose=35"))["flags"] == base["flags"]
    assert _doc(xt, _block(), version="2.31")["neuronx_cc"] != base["neuronx_cc"]


def test_canonical_hlo_leaves_the_compiled_proto_alone_and_fails_closed(xt):
    import torch

    from neuron_build.compilers import graph_key
    from neuron_build.compilers.neuron import hlo_key
    art = xt.generate_hlo(_block(), (torch.randn(2, 8),), cpu_backend=True)
    before = str(art.hlo_module)
    hlo_key.canonical_hlo(art.hlo_module)
    assert str(art.hlo_module) == before and "source_file" in before and "/" in art.hlo_module.computations[
        0].instructions[-2].metadata.source_file
    art.hlo_module.computations[0].instructions[-1].operand_ids.append(10**9)   # an id nothing defines
    with pytest.raises(graph_key.NoGraphKey, match="does not define"):
        hlo_key.canonical_hlo(art.hlo_module)

    class Opaque:
        def __reduce__(self):
            raise TypeError("no")
    art2 = xt.generate_hlo(_block(), (torch.randn(2, 8),), cpu_backend=True)
    art2.packer = Opaque()
    with pytest.raises(graph_key.NoGraphKey, match="output packer"):
        hlo_key.hlo_document(art2, [], True, None)


def test_split_api_probe(monkeypatch):
    from neuron_build.compilers.neuron import hlo_key
    activate(monkeypatch)
    mod, missing = hlo_key.split_api()
    assert mod is not None and missing is None
    activate(monkeypatch, split="0")
    mod, missing = hlo_key.split_api()
    assert mod is None and missing == "generate_neff()"


@pytest.mark.parametrize("args, kept", [
    (["--logfile", "/a/log.txt", "-O2"], ["-O2"]),
    ("--output=/w/graph.neff --model-type=transformer --cache_dir /c --verbose 35", ["--model-type=transformer"]),
    (["--target", "trn2", "--lnc=2"], ["--target", "trn2", "--lnc=2"]),
])
def test_canonical_flags(args, kept):
    from neuron_build.compilers.neuron.hlo_key import canonical_flags
    assert canonical_flags(args) == kept



def test_the_hook_raises_graph_hit_before_the_compile_and_keeps_the_key(xt, tmp_path):
    """A miss calls the original generate_neff (which compiles); a hit never does, and the hook keeps the key
    so a trace that wraps the exception still counts as a hit."""
    import json as _json
    from types import SimpleNamespace

    import torch

    from neuron_build.compilers import graph_key
    from neuron_build.compilers.neuron import hlo_key
    known = tmp_path / "known.json"
    known.write_text("[]")
    req = SimpleNamespace(options={graph_key.OPTION: {"base": {"inputs": 1}, "known": str(known)}},
                          work_dir=str(tmp_path))
    compiled = []
    module = SimpleNamespace(generate_neff=lambda *a, **k: compiled.append(a) or "neff")
    art = xt.generate_hlo(_block(), (torch.randn(2, 8),), cpu_backend=True)
    hook = hlo_key.NeffHook(module, req, "2.30")
    with hook.installed():
        assert module.generate_neff(art, str(tmp_path), ["--target", "trn1"], True) == "neff"
    assert module.generate_neff is not hook and len(compiled) == 1 and hook.hit is None and len(hook.key) == 64
    known.write_text(_json.dumps([hook.key]))
    again = hlo_key.NeffHook(module, req, "2.30")
    art2 = xt.generate_hlo(_block(), (torch.randn(2, 8),), cpu_backend=True)   # another lowering, same graph
    with pytest.raises(graph_key.GraphHit), again.installed():
        module.generate_neff(art2, str(tmp_path / "other"), ["--target", "trn1", "--logfile=/x/l.txt"], True)
    assert again.hit == hook.key and len(compiled) == 1
