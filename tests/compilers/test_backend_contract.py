"""The backend contract, over every record of :mod:`neuron_build.backends` (as the store's contract suite is
over every medium): the compiler loads and has the protocol's methods, the graph-key support a record
declares is what its compiler does, the text-generation compiler or the reason there is none, the device
kind of every hardware target the config accepts. A new backend adds one record and one :data:`CASES` row.

Cheap checks only: the "before" compilers are stopped by a graph hit before they compile; the neuron
compiler runs against the test double (``tests/fakes``) and stops before neuronx-cc; TorchNeuron is not
imported in this process (it registers a device for the whole process).
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest

from neuron_build import backends
from neuron_build.artifact import LOAD_RULES, artifact_kind
from neuron_build.backends import BACKENDS, DEVICE_KINDS, BackendSpec, get_backend
from neuron_build.compilers import graph_key
from neuron_build.compilers.base import CompileFailed, CompilerBase, CompileRequest, load_class, load_compiler
from neuron_build.compilers.textgen import textgen_compiler
from neuron_build.evaluate.validate_setup import artifact_device_kind
from neuron_build.project import config, keys, toolchain
from neuron_build.status import Status
from tests.fakes.env import activate

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """How the contract runs one backend here: ``double`` is the tests/fakes variant its toolchain needs
    (None: none), ``hardware_target`` one it accepts, ``in_process`` whether its compiler may run in this
    process (TorchNeuron registers the ``neuron`` device for the whole process: not here)."""

    double: str | None
    hardware_target: str
    in_process: bool = True


#: backend -> its case. One row per record of neuron_build.backends.BACKENDS.
CASES = {
    "neuron": Case("neuron_sdk", "trn1"),
    "torchneuron": Case("torchneuron_sdk", "trn2", in_process=False),
    "inductor": Case(None, "cpu"),
    "compile-cache": Case(None, "cpu"),
    "torchscript": Case(None, "cpu"),
}
SPECS = [pytest.param(b, id=b.name) for b in BACKENDS.values()]


def test_every_backend_has_a_case():
    assert list(CASES) == list(BACKENDS)


def request(tmp_path: Path, spec: BackendSpec, **kw) -> CompileRequest:
    out, work = tmp_path / "object", tmp_path / "work"
    out.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    base = dict(target="lin/static/fp32/p1", key="0" * 64, root=str(tmp_path), factory="lin:build", kwargs={},
                dtype="fp32", inputs=[{"name": "x", "shape": [2, 4], "dtype": "fp32", "range": None}],
                backend=spec.name, hardware_target=CASES[spec.name].hardware_target,
                compiler_args=["--optlevel=1"], inline_weights_to_neff=True, tp_degree=1, out_dir=str(out),
                work_dir=str(work), seed=0)
    base.update(kw)
    return CompileRequest(**base)


def linear():
    import torch
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).eval()


# -- the record ------------------------------------------------------------------------------------------

def test_the_config_and_the_tables_derive_from_the_records():
    assert get_args(config.Backend) == ("auto", *BACKENDS)
    assert get_args(config.NeuronTarget) == backends.NEURON_TARGETS
    assert get_args(config.Device) == backends.DEVICES
    assert get_args(config.DeviceKind) == DEVICE_KINDS
    assert config.TEXTGEN_BACKENDS == ("auto", "neuron", "inductor", "compile-cache")
    assert graph_key.BEFORE_COMPILE == ("inductor", "compile-cache", "torchscript")
    assert set(graph_key.NO_GRAPH_KEY) == {"torchneuron"}
    assert toolchain.NEURON_BACKENDS == ("neuron", "torchneuron")
    assert keys.ISA_BOUND == {("inductor", "cpu")}
    assert keys.KEY_ENV["compile-cache"] == keys.KEY_ENV["inductor"]
    with pytest.raises(KeyError, match="unknown backend 'tvm'; one of neuron, torchneuron"):
        get_backend("tvm")


@pytest.mark.parametrize("spec", SPECS)
def test_record_is_complete(spec: BackendSpec):
    assert spec.summary and spec.graph_key_why and spec.artifact
    assert spec.graph_key in get_args(backends.GraphKeySupport)
    assert spec.serving in get_args(backends.Serving)
    assert spec.artifact_kind in LOAD_RULES
    assert (spec.torch_compile_backend is not None) == (spec.serving == "caches")
    assert keys.ARTIFACT_FORMAT[spec.name] == spec.artifact_format >= 1
    assert keys.KEY_ENV[spec.name] == dict(spec.key_env) and all(spec.key_env.values())
    # the artifact's kind as a release reads it (its loader unknown): the record's
    assert artifact_kind("", spec.name, spec.artifact) == spec.artifact_kind


@pytest.mark.parametrize("spec", SPECS)
def test_device_kind_of_every_hardware_target_the_config_accepts(spec: BackendSpec):
    accepted = get_args(config.NeuronTarget) if spec.neuron_toolchain else get_args(config.Device)
    assert spec.hardware_targets == accepted
    for target in accepted:
        kind = spec.device_kinds[target]  # listed, not the fallback
        assert kind in DEVICE_KINDS
        assert artifact_device_kind(spec.name, target) == spec.device_kind(target) == kind
    assert {spec.device_kind(t) for t in accepted} == ({"neuron"} if spec.neuron_toolchain else {"cpu", "cuda"})


# -- the compiler ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", SPECS)
def test_compiler_loads_with_the_protocol(spec: BackendSpec):
    compiler = load_compiler(spec.name)
    assert isinstance(compiler, CompilerBase) and compiler.name == spec.name
    assert isinstance(compiler.needs_module, bool) and callable(compiler.preflight)
    assert type(compiler).compile is not CompilerBase.compile


@pytest.mark.parametrize("spec", SPECS)
def test_preflight_without_the_toolchain(spec: BackendSpec, monkeypatch, tmp_path):
    """No Neuron toolchain here: a Neuron backend's preflight fails as TOOLCHAIN_MISSING (exit 3) in one
    line with the fix, before any model is built; the others need none and pass."""
    activate(monkeypatch, None)
    toolchain.clear_caches()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ic"))  # restored: preflights set these
    for name in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.setenv(name, "0")
    try:
        compiler = load_compiler(spec.name)
        if spec.neuron_toolchain:
            with pytest.raises(CompileFailed) as e:
                compiler.preflight(request(tmp_path, spec))
            assert (e.value.status, e.value.exit_code) == (Status.TOOLCHAIN_MISSING, 3)
            assert "\n" not in e.value.reason and "install" in e.value.reason.lower()
        else:
            assert compiler.preflight(request(tmp_path, spec)) is None
    finally:
        toolchain.clear_caches()


@pytest.mark.parametrize("spec", SPECS)
def test_textgen_compiler_or_the_reason(spec: BackendSpec):
    if spec.builds_textgen:
        assert spec.textgen_engine and spec.textgen_reason is None
        compiler = textgen_compiler(spec.name)
        assert isinstance(compiler, CompilerBase) and compiler.name == spec.name
        assert isinstance(load_class(spec.textgen_compiler), type)
        assert spec.name in config.TEXTGEN_BACKENDS
    else:
        assert spec.textgen_reason and spec.textgen_engine is None and not spec.decode_buckets
        with pytest.raises(CompileFailed) as e:
            textgen_compiler(spec.name)
        assert e.value.status == Status.ERROR and spec.textgen_reason in e.value.reason
        assert spec.name not in config.TEXTGEN_BACKENDS


# -- the graph key: what the record declares is what the compiler does ------------------------------------

def _checkpoints(spec: BackendSpec) -> bool:
    """Does the compiler's module call ``graph_key.checkpoint`` (the one way a compiler makes a graph key)?"""
    source = inspect.getsource(sys.modules[type(load_compiler(spec.name)).__module__])
    return any(isinstance(n, ast.Attribute) and n.attr == "checkpoint" for n in ast.walk(ast.parse(source)))


def _hit_option(request_: CompileRequest) -> None:
    """Ask for a graph key whose compile another builder has just published: the gate's verdict is a hit."""
    work = Path(request_.work_dir)
    (work / "known.json").write_text("[]")
    (work / graph_key.VERDICT_FILE).write_text(json.dumps({"hit": True}))
    request_.options[graph_key.OPTION] = {"base": {"inputs": {}, "compiler": {}, "env": {}, "toolchain": {}},
                                          "known": str(work / "known.json"), "gate": True}


@pytest.mark.parametrize("spec", [p for p in SPECS if p.values[0].graph_key == "before"])
def test_before_compile_stops_on_a_hit_without_compiling(spec: BackendSpec, monkeypatch, tmp_path):
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ic"))
    for name in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.setenv(name, "0")
    assert spec.graph_capture is not None and _checkpoints(spec)
    model, x = linear(), torch.randn(2, 4)
    assert graph_key.capture_document(spec.name, model, (x,))["kind"]
    req = request(tmp_path, spec)
    _hit_option(req)
    compiler = load_compiler(spec.name)
    compiler.preflight(req)
    with pytest.raises(graph_key.GraphHit) as e:
        compiler.compile(model, (x,), req)
    assert len(e.value.graph_key) == 64
    assert list(Path(req.out_dir).iterdir()) == []  # nothing compiled, nothing written
    recorded = json.loads((Path(req.work_dir) / graph_key.GRAPH_FILE).read_text())
    assert recorded["graph_key"] == e.value.graph_key


@pytest.mark.parametrize("spec", [p for p in SPECS if p.values[0].graph_key != "before"])
def test_no_graph_outside_the_compile(spec: BackendSpec):
    import torch

    assert spec.graph_capture is None
    with pytest.raises(graph_key.NoGraphKey, match="no graph to capture outside its compile"):
        graph_key.capture_document(spec.name, linear(), (torch.randn(2, 4),))
    assert _checkpoints(spec) == (spec.graph_key == "after")
    assert (spec.name in graph_key.NO_GRAPH_KEY) == (spec.graph_key == "none")


@pytest.mark.parametrize("spec", [p for p in SPECS if p.values[0].graph_key == "after"
                                  and CASES[p.values[0].name].in_process])
def test_after_keys_what_the_compile_lowers_and_stops_before_the_compiler(spec: BackendSpec, monkeypatch,
                                                                         tmp_path):
    """The neuron backend against the double: the key of the lowered HLO module is made inside the trace,
    and a hit stops it before neuronx-cc runs (the double logs every neuronx-cc call)."""
    import torch

    from neuron_build.compilers import neuron as neuron_mod

    monkeypatch.chdir(tmp_path)
    calls = tmp_path / "calls.jsonl"
    activate(monkeypatch, CASES[spec.name].double, calls=calls)
    toolchain.clear_caches()
    monkeypatch.setattr(neuron_mod, "neuron_devices", lambda: [])
    try:
        req = request(tmp_path, spec)
        _hit_option(req)
        compiler = load_compiler(spec.name)
        compiler.preflight(req)
        with pytest.raises(graph_key.GraphHit):
            compiler.compile(linear(), (torch.randn(2, 4),), req)
        assert not calls.exists() or calls.read_text() == ""  # neuronx-cc never ran
        assert not (Path(req.out_dir) / "model.pt").exists()
    finally:
        toolchain.clear_caches()


# -- the seam: no backend-name dispatch outside the records and the backends' own modules -----------------

#: The backends' own modules (relative to neuron_build/), where a backend may name itself.
OWN_MODULES = ("backends.py", "compilers/inductor.py", "compilers/torchscript.py", "compilers/compile_cache.py",
               "compilers/textgen.py", "compilers/neuron/")
#: Modules rewritten on other branches at the time of this test; each comparison there has its descriptor
#: call listed in the backends branch's report. Empty this once they use neuron_build.backends.
PENDING: set[str] = set()


def backend_comparisons(path: Path) -> list[str]:
    """``line: source`` of each comparison in ``path`` of something named like a backend with a backend name."""
    names = set(BACKENDS)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        consts = {n.value for s in sides for n in ast.walk(s) if isinstance(n, ast.Constant)}
        if consts & names and any("backend" in ast.unparse(s) for s in sides):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_backend_name_dispatch_outside_the_records():
    pkg = REPO / "neuron_build"
    found = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        if rel.startswith(OWN_MODULES) or rel in PENDING:
            continue
        if hits := backend_comparisons(path):
            found[rel] = hits
    assert found == {}
