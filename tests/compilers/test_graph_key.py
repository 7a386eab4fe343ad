"""The graph key (the second level of the key): what leaves it alone and what changes it, per backend.

The keys are computed without compiling (:func:`neuron_build.compilers.graph_key.capture_document`: the
trace + freeze of torchscript, the ``torch.export`` program of inductor), in fresh subprocesses, from two
copies of one project at two paths with two ``PYTHONHASHSEED`` values, so a key that depends on the
process, the checkout path or the hash seed fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_build.compilers import graph_document, graph_key
from tests.helpers.cli import REPO

BASE = '''\
import torch
from torch import nn


class Net(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear, residual."""

    def __init__(self, d: int = 16, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=eps)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        h = torch.nn.functional.gelu(h)
        return x + 0.5 * self.down(h)


def build(d: int = 16, eps: float = 1e-5, seed: int = 0):
    torch.manual_seed(seed)
    return Net(d, eps)
'''

# comments, docstrings, renamed locals, a helper extracted from forward, imports reordered
NEUTRAL = '''\
from torch import nn
import torch  # reordered


def _mlp(block, inp):
    """The extracted helper."""
    hidden = block.up(block.norm(inp))  # renamed local
    hidden = torch.nn.functional.gelu(hidden)
    return block.down(hidden)


class Net(nn.Module):
    """Another docstring entirely."""

    def __init__(self, d: int = 16, eps: float = 1e-5):
        super().__init__()
        # a comment
        self.norm = nn.LayerNorm(d, eps=eps)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        y = _mlp(self, x)
        return x + 0.5 * y


def build(d: int = 16, eps: float = 1e-5, seed: int = 0):
    """Built the same way."""
    torch.manual_seed(seed)
    return Net(d, eps)
'''

ACTIVATION = BASE.replace("torch.nn.functional.gelu(h)", "torch.nn.functional.gelu(h, approximate='tanh')")
EPS = BASE.replace("nn.LayerNorm(d, eps=eps)", "nn.LayerNorm(d, eps=eps * 10)")

DRIVER = textwrap.dedent('''
    import json, sys
    from neuron_build.compilers import graph_key
    from neuron_build.examples import build_model, make_inputs
    root, cases = sys.argv[1], json.loads(sys.argv[2])
    out = {}
    for name, (backend, factory, kwargs, dtype, shape) in cases.items():
        model = build_model(root, factory, kwargs, dtype)
        specs = [{"name": "x", "shape": shape, "dtype": dtype}]
        inputs = make_inputs(specs, 0)
        base = {"compiler": {"backend": backend}, "inputs": {"dtype": dtype, "inputs": specs}}  # as base_of gives
        out[name] = graph_key.graph_key(graph_key.capture_document(backend, model, inputs), base)
    print(json.dumps(out))
''')


def project(root: Path, sources: dict[str, str]) -> Path:
    (root / "zoo").mkdir(parents=True)
    (root / "zoo" / "__init__.py").write_text("")
    for name, text in sources.items():
        (root / "zoo" / f"{name}.py").write_text(text)
    return root


def keys_in_subprocess(root: Path, cases: dict, hashseed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(root), json.dumps(cases)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, dict[str, str]]:
    """backend -> case -> graph key, from two copies of the project in two processes."""
    tmp = tmp_path_factory.mktemp("graphkey")
    one = project(tmp / "checkout-one", {"net": BASE, "neutral": NEUTRAL, "act": ACTIVATION, "eps": EPS})
    two = tmp / "elsewhere" / "checkout-two"
    shutil.copytree(one, two)
    cases, again = {}, {}
    for backend in ("torchscript", "inductor"):
        def case(factory, kwargs=None, dtype="fp32", shape=(2, 8, 16), backend=backend):
            return [backend, factory, kwargs or {}, dtype, list(shape)]
        cases.update({
            f"{backend}:base": case("zoo.net:build"),
            f"{backend}:neutral": case("zoo.neutral:build"),
            f"{backend}:activation": case("zoo.act:build"),
            f"{backend}:eps": case("zoo.eps:build"),
            f"{backend}:dtype": case("zoo.net:build", dtype="bf16"),
            f"{backend}:shape": case("zoo.net:build", shape=(2, 4, 16)),
            f"{backend}:weight": case("zoo.net:build", {"seed": 1}),
        })
        again[f"{backend}:base"] = cases[f"{backend}:base"]
    first = keys_in_subprocess(one, cases, "1")
    second = keys_in_subprocess(two, again, "2")
    out: dict[str, dict[str, str]] = {}
    for name, k in first.items():
        backend, case_name = name.split(":")
        out.setdefault(backend, {})[case_name] = k
        if name in second:
            out[backend]["other process, path and hash seed"] = second[name]
    return out


@pytest.mark.parametrize("backend", ["torchscript", "inductor"])
def test_a_graph_neutral_edit_keeps_the_graph_key_in_another_process_and_path(keys, backend):
    k = keys[backend]
    assert len(k["base"]) == 64
    assert k["neutral"] == k["base"]
    assert k["other process, path and hash seed"] == k["base"]


@pytest.mark.parametrize("backend", ["torchscript", "inductor"])
@pytest.mark.parametrize("change", ["activation", "eps", "dtype", "shape", "weight"])
def test_a_graph_changing_edit_changes_the_graph_key(keys, backend, change):
    assert keys[backend][change] != keys[backend]["base"]


def test_the_two_backends_key_different_documents(keys):
    assert keys["torchscript"]["base"] != keys["inductor"]["base"]


def test_the_base_components_enter_the_key():
    doc = {"kind": "test", "graph": [1, 2]}
    base = {"inputs": {"dtype": "fp32"}, "compiler": {"backend": "inductor", "compiler_args": ["--optlevel=2"]},
            "env": {}, "toolchain": {"torch": "2.13.0"}}
    k = graph_key.graph_key(doc, base)
    assert k == graph_key.graph_key(dict(reversed(list(doc.items()))), dict(reversed(list(base.items()))))
    for changed in ({**base, "compiler": {**base["compiler"], "compiler_args": ["--optlevel=1"]}},
                    {**base, "toolchain": {"torch": "2.14.0"}}, {**base, "env": {"TORCHINDUCTOR_FREEZING": "1"}}):
        assert graph_key.graph_key(doc, changed) != k
    assert graph_key.graph_key({**doc, "graph": [2, 1]}, base) != k
    details = {"format": 2, "model": {"sources": {"m.py": "ab"}}, **base}
    assert graph_key.base_of(details) == base


HLO = """\
# fake HLO written by the torch_neuronx test double (text, not a serialized HloModuleProto)
HloModule graph
input 0 f32[2,4]
param 0 0.weight f32[3,4] inline
op 0 aten::linear f32[2,3]{meta}
op 1 aten::relu f32[2,3]
output 0 f32[2,3]
"""


def hlo_dir(root: Path, text: str, weight: bytes = b"w0") -> Path:
    model = root / "model"
    (model / "weights").mkdir(parents=True)
    (model / "graph.hlo").write_text(text)
    (model / "weights" / "0.npy").write_bytes(weight)
    (model / "metadata.json").write_text(json.dumps({"model_files": "graph.hlo", "version": "1.0",
                                                     "weights": {"0": "weights/0.npy"}}))
    return model


def test_the_hlo_key_ignores_metadata_and_comments_and_keys_ops_and_weights(tmp_path):
    def key(name, text, weight=b"w0"):
        return graph_key.graph_key(graph_key.hlo_document(hlo_dir(tmp_path / name, text, weight)), {})

    base = key("a", HLO.format(meta=""))
    meta = ', metadata={op_name="Net/aten__linear" source_file="/home/u/a/model.py" source_line=14}'
    assert key("b", HLO.format(meta=meta)) == base
    assert key("c", "# another comment line\n" + HLO.format(meta="")) == base
    assert key("d", HLO.format(meta="").replace("aten::relu", "aten::gelu")) != base
    assert key("e", HLO.format(meta=""), weight=b"w1") != base
    with pytest.raises(graph_key.NoGraphKey, match="no HLO module"):
        graph_key.hlo_document(tmp_path / "nowhere")


def test_the_hlo_key_of_the_neuron_double_survives_a_cosmetic_edit(tmp_path):
    """The XLA trace path against the test double: the HLO it writes for the same graph from two sources
    (one with comments, renamed locals and a helper) keys the same; another activation does not."""
    from tests.fakes.env import neuron_env

    src = tmp_path / "src"
    # the double's HLO lists op kinds and types only (not gelu's approximate=): swap the activation
    project(src, {"net": BASE, "neutral": NEUTRAL, "act": BASE.replace("torch.nn.functional.gelu(h)", "torch.relu(h)")})
    script = textwrap.dedent('''
        import json, sys
        import torch_neuronx
        from neuron_build.compilers import graph_key
        from neuron_build.examples import build_model, make_inputs
        root, work = sys.argv[1], sys.argv[2]
        out = {}
        for name in ("net", "neutral", "act"):
            model = build_model(root, f"zoo.{name}:build", {}, "fp32")
            x = make_inputs([{"name": "x", "shape": [2, 8, 16], "dtype": "fp32"}], 0)
            wd = f"{work}/{name}"
            torch_neuronx.trace(model, x, compiler_workdir=wd, cpu_backend=True, compiler_args=["--target", "trn1"])
            out[name] = graph_key.graph_key(graph_key.hlo_document(f"{wd}/model"), {})
        print(json.dumps(out))
    ''')
    env = neuron_env("neuron_sdk")
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(REPO)])
    proc = subprocess.run([sys.executable, "-c", script, str(src), str(tmp_path / "work")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)  # the double's compiler logs to its cwd
    assert proc.returncode == 0, proc.stderr[-3000:]
    k = json.loads(proc.stdout.strip().splitlines()[-1])
    assert k["neutral"] == k["net"] and k["act"] != k["net"]


def test_a_new_artifact_format_of_the_backend_changes_both_keys(tiny, monkeypatch):
    from neuron_build.project import keys
    from neuron_build.project.config import load_project

    def key():
        km = keys.KeyMaker(load_project(tiny))
        from neuron_build.project.matrix import expand
        t = expand(km.project)[0]
        return km.key(t)

    before = key()
    monkeypatch.setitem(keys.ARTIFACT_FORMAT, "torchscript", keys.ARTIFACT_FORMAT["torchscript"] + 1)
    after = key()
    assert keys.diff_components(before.details, after.details) == ["compiler: artifact_format"]
    assert graph_key.graph_key({}, graph_key.base_of(before.details)) != graph_key.graph_key(
        {}, graph_key.base_of(after.details))


# -- the key descends into bodies, custom ops, output names, mutated buffers (issue 29, items 1 and 2) ----

BODIES = '''\
import torch
from torch import nn
from torch._higher_order_ops.map import map as hmap


class Bodies(nn.Module):
    """Each edit below changes one op or constant inside a body the top graph reaches only by get_attr."""

    def __init__(self, clamp=1.0, act="relu", mul=2.0, autocast_scale=1.0, grad_scale=2.0, out="logits", start=0.0):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.register_buffer("steps", torch.full((4,), start))
        self.clamp, self.act, self.mul, self.out = clamp, act, mul, out
        self.autocast_scale, self.grad_scale = autocast_scale, grad_scale

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: torch.clamp(t, max=self.clamp),
                       lambda t: getattr(torch, self.act)(t) * 2.0, (x,))
        y = hmap(lambda row: row * self.mul, y)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.lin(y) * self.autocast_scale
        with torch.enable_grad():
            y = y.float() * self.grad_scale
        self.steps.add_(1.0)  # a buffer forward updates in place
        return {self.out: y + self.steps}
'''

#: edit -> the constructor arguments that make it (each inside a body, or the output's name, or a buffer)
BODY_EDITS = {"cond branch: clamp bound 1.0 -> 2.0": {"clamp": 2.0},
              "cond branch: relu -> tanh": {"act": "tanh"},
              "map body: * 2.0 -> * 3.0": {"mul": 3.0},
              "autocast region: * 1.0 -> * 3.0": {"autocast_scale": 3.0},
              "enable_grad region: * 2.0 -> * 3.0": {"grad_scale": 3.0},
              "output name: logits -> scores": {"out": "scores"},
              "mutated buffer's initial value": {"start": 1.0}}


@pytest.fixture(scope="module")
def bodies(tmp_path_factory):
    """kwargs -> the inductor (``torch.export``) graph key of :data:`BODIES` built with them."""
    import importlib.util

    import torch

    path = tmp_path_factory.mktemp("bodies") / "bodies.py"
    path.write_text(BODIES)
    spec = importlib.util.spec_from_file_location("graph_key_bodies", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # Dynamo (torch.cond, map) imports the module of the code it traces
    spec.loader.exec_module(mod)
    x = (torch.randn(2, 4),)

    def key(**kwargs) -> str:
        return graph_key.graph_key(graph_key.capture_document("inductor", mod.Bodies(**kwargs).eval(), x), {})
    return key


def test_the_export_document_reads_every_body(bodies):
    base = bodies()
    assert base == bodies()  # deterministic
    changed = {name: bodies(**kw) != base for name, kw in BODY_EDITS.items()}
    assert changed == {name: True for name in BODY_EDITS}


def test_the_compile_cache_document_reads_the_bodies_too():
    """compile-cache keys the same ``torch.export`` document (plus how the serving host rebuilds the model)."""
    import torch

    from neuron_build.compilers.compile_cache import CompileCacheCompiler

    class Req:
        factory, kwargs, hf = "m:build", {}, None

    def doc(limit):
        class M(torch.nn.Module):
            def forward(self, x):
                return torch.cond(x.sum() > 0, lambda t: t.clamp(max=limit), lambda t: t * 2.0, (x,))
        return CompileCacheCompiler._graph_document(M(), (torch.randn(2, 4),), Req())
    assert graph_key.document_digest(doc(1.0)) != graph_key.document_digest(doc(2.0))


def test_a_mutated_buffer_enters_the_torchscript_key_by_value():
    """torch.jit.freeze keeps ``prim::GetAttr`` for a buffer forward updates in place: its value is keyed."""
    import torch

    class Counter(torch.nn.Module):
        def __init__(self, start):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)
            self.register_buffer("steps", torch.full((4,), start))

        def forward(self, x):
            self.steps.add_(1.0)
            return self.lin(x) + self.steps

    x = (torch.randn(2, 4),)
    docs = [graph_key.capture_document("torchscript", Counter(s), x) for s in (0.0, 0.0, 1.0)]
    keys = [graph_key.graph_key(d, {}) for d in docs]
    assert keys[0] == keys[1] != keys[2]
    with pytest.raises(graph_key.NoGraphKey, match="prim::GetAttr steps"):
        frozen = torch.jit.freeze(torch.jit.trace(Counter(0.0), x, check_trace=False).eval())
        graph_key.torchscript_document(frozen.graph)  # without the module the value cannot be read: no key


CUSTOM_OPS = '''\
import torch

lib = torch.library.Library("nbkey", "DEF")
lib.define("scale(Tensor x) -> Tensor")


def _factor():
    return {factor}


def scale(x):
    return x * _factor()


lib.impl("scale", scale, "CompositeImplicitAutograd")


@torch.library.custom_op("nbkey::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    return x + {shift}


@shift.register_fake
def _(x):
    return torch.empty_like(x)
'''

CUSTOM_MODEL = '''\
import torch
import ops  # registers nbkey::scale and nbkey::shift


class UsesOps(torch.nn.Module):
    def forward(self, x):
        return torch.ops.nbkey.{op}(x)


def build():
    return UsesOps()
'''

CUSTOM_DRIVER = textwrap.dedent('''
    import json, sys
    import torch
    from neuron_build.compilers import graph_key
    from neuron_build.examples import build_model
    root, watch = sys.argv[1], sys.argv[2] == "1"
    if watch:
        graph_key.watch_custom_ops()
    out = {}
    for backend in ("inductor", "torchscript"):
        for op in ("scale", "shift"):
            model = build_model(root, f"model_{op}:build", {}, "fp32")
            try:
                out[f"{backend}:{op}"] = graph_key.graph_key(
                    graph_key.capture_document(backend, model, (torch.ones(2, 4),)), {})
            except graph_key.NoGraphKey as e:
                out[f"{backend}:{op}"] = "no graph key: " + str(e)
    print(json.dumps(out))
''')


def test_a_custom_op_is_keyed_by_its_implementation(tmp_path):
    """A ``torch.library`` op (CompositeImplicitAutograd, in a helper module) and a ``custom_op``, in the
    exported program and in the frozen TorchScript graph: an edit of the implementation (or of a helper it
    calls) changes the key, a comment does not; kernels registered before
    :func:`graph_key.watch_custom_ops` cannot be read, so there is no graph key."""
    variants = {"base": CUSTOM_OPS.format(factor="2.0", shift="1.0"),
                "comment": "# a comment only\n" + CUSTOM_OPS.format(factor="2.0", shift="1.0"),
                "edited": CUSTOM_OPS.format(factor="3.0", shift="5.0")}
    for v, text in variants.items():  # one project folder per variant: the same module names
        (tmp_path / v).mkdir()
        (tmp_path / v / "ops.py").write_text(text)
        for op in ("scale", "shift"):
            (tmp_path / v / f"model_{op}.py").write_text(CUSTOM_MODEL.format(op=op))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}

    def keys(variant, watch=True):
        proc = subprocess.run([sys.executable, "-c", CUSTOM_DRIVER, str(tmp_path / variant), "1" if watch else "0"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    base, comment, edited = keys("base"), keys("comment"), keys("edited")
    assert sorted(base) == ["inductor:scale", "inductor:shift", "torchscript:scale", "torchscript:shift"]
    for case in base:
        assert len(base[case]) == 64, base[case]
        assert comment[case] == base[case]
        assert edited[case] != base[case], f"{case}: an edit of the op's implementation kept the graph key"
    unwatched = keys("base", watch=False)
    assert unwatched["inductor:scale"].startswith("no graph key: custom op nbkey::scale")
    assert unwatched["torchscript:scale"].startswith("no graph key: custom op nbkey::scale")


def test_what_the_key_cannot_read_means_no_graph_key():
    """Fail closed: a call of an arbitrary Python function, a higher-order op whose body lives in a side
    table, a get_attr of an object that is neither a graph module nor a tensor."""
    import torch
    import torch.fx

    def opaque(x):
        return x * 2

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(opaque, (x,)))
    with pytest.raises(graph_key.NoGraphKey, match="opaque, whose implementation"):
        graph_document.graph_module_document(torch.fx.GraphModule(torch.nn.Module(), g))

    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(triton_kernel_wrapper_functional, (), {"kernel_idx": 0, "constant_args_idx": 0,
                                                                     "grid": [], "kwargs": {"x": x},
                                                                     "tensors_to_clone": []}))
    with pytest.raises(graph_key.NoGraphKey, match="triton_kernel_wrapper_functional"):
        graph_document.graph_module_document(torch.fx.GraphModule(torch.nn.Module(), g))

    root = torch.nn.Module()
    root.thing = torch.nn.ReLU()  # a module that is not a GraphModule: its forward is not read
    g = torch.fx.Graph()
    g.output(g.get_attr("thing"))
    with pytest.raises(graph_key.NoGraphKey, match="get_attr thing reads a ReLU"):
        graph_document.graph_module_document(torch.fx.GraphModule(root, g))
