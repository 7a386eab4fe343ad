"""The neuron backend's pieces, in this process: signature probing, failure classification against the
double's real compiler output, and compiles through the double's torch_neuronx."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from neuron_build.compilers import neuron as neuron_mod
from neuron_build.compilers.base import CompileFailed, CompileRequest
from neuron_build.compilers.neuron import (
    NeuronCompiler,
    classify_failure,
    graph_env,
    plan_trace_kwargs,
    signature_params,
)
from neuron_build.project import toolchain
from tests.fakes.env import activate, neuron_env

CC_VERSION = "2.30.4217.0+5e1f0c2a"
P_27 = ["func", "example_inputs", "compiler_workdir", "compiler_args"]
P_216 = ["func", "example_inputs", "input_output_aliases", "compiler_workdir", "compiler_args",
         "partitioner_config", "inline_weights_to_neff"]
P_221 = P_216 + ["cpu_backend"]
ARGS = ["--optlevel=2", "--target", "trn1", "--logfile=/w/log-neuron-cc.txt"]


def plan(params, **kw):
    base = dict(profile="o2", workdir="/w", compiler_args=ARGS, inline_weights_to_neff=True,
                has_neuron_device=False, tnx_version="2.13.0.2.30.4217")
    base.update(kw)
    return plan_trace_kwargs(params, **base)


# --------------------------------------------------------------------------- signature probing

def test_plan_passes_only_what_the_signature_has():
    assert plan(P_221) == {"compiler_workdir": "/w", "compiler_args": ARGS, "inline_weights_to_neff": True,
                           "cpu_backend": True}
    assert plan(P_221, has_neuron_device=True, inline_weights_to_neff=False) == {
        "compiler_workdir": "/w", "compiler_args": ARGS, "inline_weights_to_neff": False}
    assert plan(P_27, has_neuron_device=True) == {"compiler_workdir": "/w", "compiler_args": ARGS}
    assert plan(P_216, has_neuron_device=True) == {"compiler_workdir": "/w", "compiler_args": ARGS,
                                                   "inline_weights_to_neff": True}
    # parallel_model_trace has no cpu_backend: never planned for it
    assert plan(["func", "example_inputs", "compiler_workdir", "compiler_args", "inline_weights_to_neff",
                 "tp_degree"], api="neuronx_distributed.trace.parallel_model_trace") == {
        "compiler_workdir": "/w", "compiler_args": ARGS, "inline_weights_to_neff": True}


def test_plan_fails_clearly_when_the_version_lacks_what_is_needed():
    with pytest.raises(CompileFailed) as e:
        plan(P_27, has_neuron_device=True, inline_weights_to_neff=False)
    assert e.value.status == "TOOLCHAIN_MISSING" and e.value.exit_code == 3
    assert e.value.reason.startswith(
        "profile o2 sets inline_weights_to_neff = false, but torch_neuronx.trace() of the installed torch-neuronx "
        "2.13.0.2.30.4217 has no inline_weights_to_neff parameter (added in SDK 2.16); install a torch-neuronx")
    assert e.value.reason.endswith("or set inline_weights_to_neff = true")
    with pytest.raises(CompileFailed) as e:
        plan(P_216)
    assert e.value.status == "TOOLCHAIN_MISSING"
    assert e.value.reason.startswith(
        "this host has no Neuron device (/dev/neuron* not found) and torch_neuronx.trace() of the installed "
        "torch-neuronx 2.13.0.2.30.4217 has no cpu_backend parameter (added in SDK 2.21) to compile without one")


def test_signature_params_ignores_catch_alls():
    def real_like(func, example_inputs, *_, compiler_workdir=None, compiler_args=None, **kwargs):
        pass
    assert signature_params(real_like) == ["func", "example_inputs", "compiler_workdir", "compiler_args"]
    assert "inline_weights_to_neff" not in plan(signature_params(real_like), has_neuron_device=True)


def test_graph_env_matches_the_key():
    env = {"NEURON_CC_FLAGS": "--auto-cast=none", "XLA_USE_BF16": "1", "XLA_DOWNCAST_BF16": "0",
           "NEURON_RT_VISIBLE_CORES": "0", "NEURON_COMPILE_CACHE_URL": "/tmp/c", "NEURON_BUILD_CONFIG": "x",
           "NEURON_LOGICAL_NC_CONFIG": "2", "PATH": "/bin"}
    assert graph_env(env) == {"NEURON_CC_FLAGS": "--auto-cast=none", "NEURON_LOGICAL_NC_CONFIG": "2",
                              "XLA_DOWNCAST_BF16": "0", "XLA_USE_BF16": "1"}


# --------------------------------------------------------------------------- failure classes

HLO = "# test HLO\nHloModule graph\ninput 0 f32[2,4]\nop 0 aten::linear f32[2,3]\nop 1 aten::add f32[2,3]\n"


def run_fake_cc(tmp_path: Path, **switches) -> tuple[int, Path]:
    """Run the double's neuronx-cc on a tiny HLO; returns (exit status, log path)."""
    (tmp_path / "graph.hlo").write_text(HLO)
    log = tmp_path / "neuron" / "log-neuron-cc.txt"
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.run(["neuronx-cc", "compile", str(tmp_path / "graph.hlo"), "--framework", "XLA", "--target",
                           "trn1", "--output", str(tmp_path / "graph.neff"), f"--logfile={log}"],
                          env=neuron_env(**switches), cwd=tmp_path, capture_output=True, timeout=60)
    return proc.returncode, log


@pytest.mark.parametrize("mode,status,exit_code,reason", [
    ("xcg815", "ERROR", 1, "XCG815: Estimated peak HBM usage (22.84) exceeds 16GB. The graph does not fit one "
                           "NeuronCore; use a smaller bucket or shard the model."),
    ("eoom", "ERROR", 1, "NCC_EOOM001: Out of device memory: this graph needs about 22.84 GB of HBM and a "
                         "NeuronCore has 16 GB. Use a smaller bucket or more tensor parallelism."),
    ("evrf", "ERROR", 1, "NCC_EVRF007: Compiler generated too many instructions (6888787); the limit is 5000000. "
                         "Split the graph or compile smaller buckets."),
    ("euoc", "ERROR", 1, "NCC_EUOC002: The operator aten::add has no implementation for trn1; rewrite it or keep "
                         "it on the CPU."),
    ("internal", "ERROR", 1, "Internal compiler error in pass OperatorFusion; please report it with this log."),
    ("transient", "TRANSIENT", 70, "neuronx-cc exited with status 70 (a transient tool failure): A compiler "
                                   "worker process ended unexpectedly; the compile was abandoned."),
    ("sigkill", "KILLED", 137, "neuronx-cc was killed by SIGKILL (usually the kernel's out-of-memory killer)"),
])
def test_classify_the_doubles_failures(tmp_path, mode, status, exit_code, reason):
    rc, log = run_fake_cc(tmp_path, fail=mode)
    failed = classify_failure(RuntimeError(f"neuronx-cc failed with {rc}"), [log], tmp_path,
                              has_neuron_device=False, compiler_peak_rss_bytes=1234)
    assert (failed.status, failed.exit_code, failed.reason) == (status, exit_code, reason)
    assert failed.details["compiler_exit_code"] == {"transient": 70, "sigkill": -9}.get(mode, 1)
    assert failed.details["compiler_peak_rss_bytes"] == 1234
    assert failed.details["compiler_log"] == "neuron/log-neuron-cc.txt"
    if status == "ERROR" and mode != "internal":
        (diag,) = failed.details["diagnostics"]
        assert diag["code"] == reason.split(":")[0] and reason.endswith(diag["message"])
        assert diag["line"] == 3  # "Invoked as" line, the dots line, then the diagnostic
    if mode == "evrf":
        assert failed.details["log"]["instruction_count"] == 6888787
    if mode == "internal":
        assert failed.details["log"]["internal_errors"][-1]["text"] == "AssertionError: fused tensor lost its layout"


def test_classify_other_exceptions_and_missing_log(tmp_path):
    failed = classify_failure(ValueError("cpu_backend=True needs the hardware target\nmore"), [tmp_path / "none"],
                              tmp_path, has_neuron_device=False)
    assert (failed.status, failed.exit_code, failed.reason) == (
        "ERROR", 1, "ValueError: cpu_backend=True needs the hardware target")
    assert "log" not in failed.details
    failed = classify_failure(RuntimeError("neuronx-cc failed with 1"), [tmp_path / "none"], tmp_path,
                              has_neuron_device=False)
    assert failed.reason == "neuronx-cc failed with status 1 (no compiler log)"
    failed = classify_failure(RuntimeError("Neuron runtime initialization failed: no Neuron device"), [], tmp_path,
                              has_neuron_device=False, tp_degree=2)
    assert failed.reason == ("RuntimeError: Neuron runtime initialization failed: no Neuron device (this host has "
                             "no Neuron device, /dev/neuron* not found; tensor-parallel tracing with "
                             "neuronx-distributed needs one)")


# --------------------------------------------------------------------------- compiles in this process

def request(tmp_path: Path, **kw) -> CompileRequest:
    out, work = tmp_path / "object", tmp_path / "work"
    out.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    base = dict(target="lin/static/fp32/p1", key="0" * 64, root=str(tmp_path), factory="lin:build", kwargs={},
                dtype="fp32", inputs=[], backend="neuron", hardware_target="trn1", compiler_args=["--optlevel=1"],
                inline_weights_to_neff=True, tp_degree=1, out_dir=str(out), work_dir=str(work), seed=0)
    base.update(kw)
    return CompileRequest(**base)


@pytest.fixture
def sdk(monkeypatch, tmp_path):
    """Activate the double in this process; returns a function to (re)activate with switches."""
    monkeypatch.chdir(tmp_path)

    def use(variant="neuron_sdk", devices=(), **switches):
        env = activate(monkeypatch, variant, **switches)
        toolchain.clear_caches()
        monkeypatch.setattr(neuron_mod, "neuron_devices", lambda: list(devices))
        return env

    yield use
    toolchain.clear_caches()


def linear():
    import torch
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).eval()


def test_compile_2_7_signature_on_a_neuron_host(sdk, tmp_path):
    import torch
    sdk(signature="2.7", has_device=True, log_format="verbose", devices=["/dev/neuron0"])
    model, x = linear(), torch.randn(2, 4)
    req = request(tmp_path)
    result = NeuronCompiler().compile(model, (x,), req)
    out = Path(req.out_dir)
    assert sorted(p.name for p in out.iterdir()) == ["command.txt", "compile.log", "model.neff", "model.pt"]
    d = result.details
    assert d["trace_parameters"] == P_27
    assert d["trace_kwargs"] == {}          # 2.7 has neither inline_weights_to_neff nor cpu_backend
    assert d["compiler_args"] == ["--optlevel=1", "--target", "trn1", "--logfile=<workdir>/log-neuron-cc.txt"]
    assert d["cpu_backend"] is False and d["neuron_devices"] == ["/dev/neuron0"]
    # the verbose log has pass times but no op count: the count comes from torch_neuronx.analyze
    assert list(d["logs"]["compile.log"]["pass_times"]) == [
        "HloImport", "OpLowering", "OperatorFusion", "InstructionScheduling", "MemoryAllocation",
        "CodeGeneration", "NeffPackaging"]
    assert (result.op_count, result.op_count_source) == (1, "torch_neuronx.analyze operator counts")
    assert d["analyze"] == {"supported_operators": {"aten::linear": 1}, "unsupported_operators": [],
                            "support_percentage": "100.00%"}
    assert d["metrics"]["compiler_status"] == "PASS" and d["metrics"]["compiler_compile_time_s"] is None
    neff = d["neff"]["model.neff"]
    assert neff["build_version"] == CC_VERSION and neff["neff_version"] == "2.0"
    assert neff["file_size"] == (out / "model.neff").stat().st_size == neff["data_size"] + 1024
    assert neff["payload_kind"] == "tar.gz" and neff["name"] == "graph"
    assert d["toolchain"] == {"neuronx-cc --version": CC_VERSION}
    assert (out / "command.txt").read_text().startswith("neuronx-cc compile model --framework XLA --target trn1")
    # the saved model loads (after import torch_neuronx), computes, and refuses another shape
    import torch_neuronx  # noqa: F401
    loaded = torch.jit.load(str(out / "model.pt"))
    assert torch.allclose(loaded(x), model(x))
    with pytest.raises(RuntimeError, match="Neuron model input 0: expected shape"):
        loaded(torch.randn(3, 4))


def test_compile_summary_log_op_count_and_external_weights(sdk, tmp_path):
    import torch
    sdk(signature="2.21", log_format="summary")
    req = request(tmp_path, inline_weights_to_neff=False, compiler_args=["--model-type=transformer", "--optlevel=2"])
    result = NeuronCompiler().compile(linear(), (torch.randn(2, 4),), req)
    d = result.details
    assert d["trace_kwargs"] == {"inline_weights_to_neff": False, "cpu_backend": True}
    assert (result.op_count, result.op_count_source) == (1, "neuronx-cc log")
    assert isinstance(d["compiler_compile_time_s"], float) and d["compiler_compile_time_s"] >= 0
    assert d["metrics"]["compiler_compile_time_s"] == d["logs"]["compile.log"]["compile_time_s"]
    assert "analyze" not in d
    hlo = (Path(req.work_dir) / "neuron" / "model" / "graph.hlo").read_text()
    assert "param 0 weight f32[3,4] external" in hlo


def test_preflight_refusals(sdk, tmp_path):
    sdk(signature="2.16")
    with pytest.raises(CompileFailed) as e:
        NeuronCompiler().preflight(request(tmp_path))
    assert e.value.status == "TOOLCHAIN_MISSING" and "no cpu_backend parameter (added in SDK 2.21)" in e.value.reason
    sdk(signature="2.7", devices=["/dev/neuron0"])
    with pytest.raises(CompileFailed) as e:
        NeuronCompiler().preflight(request(tmp_path, inline_weights_to_neff=False))
    assert "has no inline_weights_to_neff parameter (added in SDK 2.16)" in e.value.reason
    sdk("placeholder")
    with pytest.raises(CompileFailed) as e:
        NeuronCompiler().preflight(request(tmp_path))
    assert e.value.status == "TOOLCHAIN_MISSING"
    assert e.value.reason.startswith("The Neuron toolchain is not installed (found the PyPI placeholder: "
                                     "torch-neuronx 1.0, neuronx-cc 1.0.post1); uninstall them and install the real "
                                     "toolchain from AWS's Neuron package index (pip install --extra-index-url "
                                     "https://pip.repos.neuron.amazonaws.com neuronx-cc==2.* torch-neuronx "
                                     "neuronx-distributed;")


def test_compile_with_a_non_utf8_log_and_old_format(sdk, tmp_path):
    import torch
    sdk(fail="nonutf8", log_format="old")
    req = request(tmp_path)
    result = NeuronCompiler().compile(linear(), (torch.randn(2, 4),), req)
    log = result.details["logs"]["compile.log"]
    assert log["status"] == "PASS" and log["replaced_bytes"] == 3
    assert log["unparsed"][0].startswith("3 non-UTF-8 byte(s) replaced with U+FFFD (first on line 10)")
    assert len(log["pass_times"]) == 7 and "job.OperatorFusion" in log["pass_times"]
    assert b"tmp\xff\xfe\xc3(.bin" in (Path(req.out_dir) / "compile.log").read_bytes()  # stored as written
