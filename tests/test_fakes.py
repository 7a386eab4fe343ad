"""Tests of the Neuron test double itself (tests/fakes). Everything Neuron runs in subprocesses."""

from __future__ import annotations

import gzip
import importlib.metadata
import importlib.util
import io
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
_spec = importlib.util.spec_from_file_location("neuron_fakes_env", FAKES / "env.py")
fakes_env = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakes_env)
neuron_env = fakes_env.neuron_env

NEFF_HEADER = struct.Struct("<QQQQQ128sI32s16s256sI64sQI468s")
CC_VERSION = "2.30.4217.0+5e1f0c2a"
HLO = textwrap.dedent("""\
    # test HLO
    HloModule graph
    input 0 f32[2,4]
    op 0 aten::linear f32[2,3]
    op 1 aten::relu f32[2,3]
    op 2 aten::add f32[2,3]
    output 0 f32[2,3]
    """)


def run_py(code: str, env: dict, cwd: Path, timeout: float = 60) -> dict:
    """Runs `code` in a fresh interpreter; it must print one JSON object as its last stdout line."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cc(args, env, cwd, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(["neuronx-cc", *args], env=env, cwd=cwd, capture_output=True,
                          timeout=timeout)


def read_neff(path: Path) -> dict:
    data = path.read_bytes()
    fields = NEFF_HEADER.unpack(data[:1024])
    payload = gzip.decompress(data[1024:])
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    return {
        "pkg_version": fields[0], "header_size": fields[1], "data_size": fields[2],
        "major": fields[3], "minor": fields[4], "build": fields[5].rstrip(b"\0").decode(),
        "num_tpb": fields[6], "name": fields[9].rstrip(b"\0").decode(), "lnc_size": fields[13],
        "file_size": len(data), "members": members,
    }


@pytest.fixture
def hlo_dir(tmp_path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "graph.hlo").write_text(HLO)
    return tmp_path


# --------------------------------------------------------------------------- env helper

def test_neuron_env_sets_paths_and_switches(tmp_path):
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/x", "FAKE_NEURONX_CC_FAIL": "hang"}
    env = neuron_env("neuron_sdk", base=base, fail="xcg815", has_device=True, sleep=0.5,
                     counter=tmp_path / "n", calls=None)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(FAKES / "neuron_sdk"), "/x"]
    assert env["PATH"].split(os.pathsep) == [str(FAKES / "bin"), "/usr/bin"]
    assert env["FAKE_NEURON_PYTHON"] == sys.executable
    assert env["FAKE_NEURONX_CC_FAIL"] == "xcg815"
    assert env["FAKE_NEURON_HAS_DEVICE"] == "1"
    assert env["FAKE_NEURONX_CC_SLEEP"] == "0.5"
    assert env["FAKE_NEURONX_CC_COUNTER"] == str(tmp_path / "n")
    assert "FAKE_NEURONX_CC_CALLS" not in env
    # re-wrapping replaces the variant instead of stacking; placeholder has no compiler
    env2 = neuron_env("placeholder", base=env)
    assert env2["PYTHONPATH"].split(os.pathsep) == [str(FAKES / "placeholder"), "/x"]
    assert env2["PATH"] == "/usr/bin"
    assert not [k for k in env2 if k.startswith("FAKE_") and k != "FAKE_NEURON_PYTHON"]
    assert "PYTHONPATH" not in neuron_env(None, base={"PATH": "/usr/bin"})
    with pytest.raises(TypeError):
        neuron_env(failure="xcg815")


# --------------------------------------------------------------------------- neuronx-cc

def test_cc_version_matches_packages(tmp_path):
    proc = cc(["--version"], neuron_env(), tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.decode().splitlines()[0] == f"NeuronX Compiler version {CC_VERSION}"
    dists = {d.metadata["Name"]: d.version
             for d in importlib.metadata.distributions(path=[str(FAKES / "neuron_sdk")])}
    assert dists == {"torch-neuronx": "2.13.0.2.30.4217", "neuronx-cc": CC_VERSION,
                     "neuronx-distributed": "0.17.4217", "libneuronxla": "2.3.4217.0"}
    assert f'__version__ = "{CC_VERSION}"' in (FAKES / "neuron_sdk/neuronxcc/__init__.py").read_text()


@pytest.mark.parametrize("log_format", ["pass", "summary", "verbose", "old"])
def test_cc_compile_success(hlo_dir, log_format):
    env = neuron_env(log_format=log_format)
    proc = cc(["compile", "model", "--framework", "XLA", "--target", "trn1", "--output", "g.neff"],
              env, hlo_dir)
    assert proc.returncode == 0, proc.stderr
    log = (hlo_dir / "log-neuron-cc.txt").read_text()  # default log name, in the cwd
    assert proc.stdout.decode() == log  # echoed to stdout
    lines = log.splitlines()
    assert "Invoked as: neuronx-cc compile model --framework XLA" in lines[0]
    if log_format == "summary":
        assert lines[-3].endswith(" NEFF op count: 3")
        assert " Compile time: " in lines[-2] and lines[-2].endswith(" sec")
        assert lines[-1].endswith(f" INFO {lines[-1].split()[2]} Compiler status: SUCCESS")
    else:
        assert lines[-1] == "Compiler status PASS"
    if log_format == "pass":
        assert "......." in lines
    if log_format == "verbose":
        assert any(line.endswith("[pipeline]: Running OpLowering") for line in lines)
        assert any("OpLowering finished after 0.0" in line and line.endswith(" seconds") for line in lines)
    if log_format == "old":
        assert any("Exit time region: delta=0.0" in line and line.endswith("s") for line in lines)
    neff = read_neff(hlo_dir / "g.neff")
    assert neff["header_size"] == 1024 and neff["data_size"] == neff["file_size"] - 1024
    assert neff["major"] == 2 and neff["build"] == CC_VERSION and neff["lnc_size"] == 1
    assert neff["name"] == "graph"
    meta = json.loads(neff["members"]["neff.json"])
    assert meta["target"] == "trn1" and meta["op_count"] == 3


def test_cc_flags(hlo_dir):
    env = neuron_env(log_format="summary", sleep=0.35)
    t0 = time.monotonic()
    proc = cc(["compile", "model/graph.hlo", "--target=trn1", "--target", "trn2", "-O2", "--lnc=2",
               "--auto-cast", "matmult", "--verbose=35", "--enable-mixed-precision-accumulation",
               "--output=out.neff", "--logfile", "logs.txt"], env, hlo_dir)
    assert time.monotonic() - t0 >= 0.35
    assert proc.returncode == 0, proc.stdout
    neff = read_neff(hlo_dir / "out.neff")
    assert neff["lnc_size"] == 2 and json.loads(neff["members"]["neff.json"])["target"] == "trn2"
    assert not (hlo_dir / "log-neuron-cc.txt").exists()
    seconds = float((hlo_dir / "logs.txt").read_text().split("Compile time: ")[1].split()[0])
    assert seconds >= 0.3
    # mistyped values fail late (after the compile time), with exit status 1
    bad = cc(["compile", "model", "--target", "trn1", "--auto-cast=matmul", "--output", "x.neff"],
             neuron_env(), hlo_dir)
    assert bad.returncode == 1 and not (hlo_dir / "x.neff").exists()
    log = (hlo_dir / "log-neuron-cc.txt").read_text()
    assert "Invalid value 'matmul' for --auto-cast" in log and log.endswith("Compiler status ERROR\n")
    assert cc(["compile", "model", "--lnc", "2", "--output", "y.neff"], neuron_env(), hlo_dir).returncode == 1
    assert cc(["compile", "--output", "y.neff"], neuron_env(), hlo_dir).returncode == 2


FAILS = {
    # mode: (exit status, text in the log)
    "xcg815": (1, "[XCG815]  Estimated peak HBM usage (22.84) exceeds 16GB."),
    "eoom": (1, "[NCC_EOOM001] "),
    "evrf": (1, "[NCC_EVRF007] Compiler generated too many instructions (6888787)"),
    "euoc": (1, "[NCC_EUOC002] The operator aten::add "),
    "internal": (1, "Traceback (most recent call last):"),
    "transient": (70, "ERROR"),
}


@pytest.mark.parametrize("mode", sorted(FAILS))
def test_cc_failures(hlo_dir, mode):
    rc, text = FAILS[mode]
    proc = cc(["compile", "model", "--target", "trn1", "--output", "g.neff"], neuron_env(fail=mode), hlo_dir)
    assert proc.returncode == rc
    log = (hlo_dir / "log-neuron-cc.txt").read_text()
    assert text in log
    assert log.splitlines()[-1] == "Compiler status ERROR"
    assert not (hlo_dir / "g.neff").exists()
    if mode in ("eoom", "evrf", "euoc", "internal", "transient"):
        assert any(" ERROR " in line and "[neuronx-cc]: " in line for line in log.splitlines())
    if mode == "internal":
        assert log.splitlines()[-2] == "AssertionError: fused tensor lost its layout"


def test_cc_failure_summary_format(hlo_dir):
    proc = cc(["compile", "model", "--output", "g.neff"], neuron_env(fail="evrf", log_format="summary"),
              hlo_dir)
    assert proc.returncode == 1
    lines = (hlo_dir / "log-neuron-cc.txt").read_text().splitlines()
    assert "too many instructions (6888787)" in lines[-3]
    assert " Compile time: " in lines[-2]
    assert lines[-1].endswith("Compiler status: FAILED")
    assert not any("NEFF op count" in line for line in lines)


def test_cc_nonutf8_log(hlo_dir):
    proc = cc(["compile", "model", "--output", "g.neff"], neuron_env(fail="nonutf8"), hlo_dir)
    assert proc.returncode == 0
    raw = (hlo_dir / "log-neuron-cc.txt").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert raw.decode("utf-8", "replace").splitlines()[-1] == "Compiler status PASS"
    assert (hlo_dir / "g.neff").exists()


def test_cc_sigkill_after_allocating(hlo_dir):
    code = """
        import resource, subprocess, sys
        rc = subprocess.run(["neuronx-cc", "compile", "model", "--output", "g.neff"],
                            stdout=subprocess.DEVNULL).returncode
        print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=neuron_env(fail="sigkill"),
                          cwd=hlo_dir, capture_output=True, text=True, timeout=30)
    rc, maxrss_kb = map(int, proc.stdout.split())
    assert rc == -signal.SIGKILL
    assert maxrss_kb > 50 * 1024
    log = (hlo_dir / "log-neuron-cc.txt").read_text()
    assert "Compiler status" not in log and not (hlo_dir / "g.neff").exists()


def test_cc_hang_is_killed_by_timeout(hlo_dir):
    proc = subprocess.Popen(["neuronx-cc", "compile", "model", "--output", "g.neff"],
                            env=neuron_env(fail="hang", hang_max=60), cwd=hlo_dir,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=5) == -signal.SIGKILL
    log = (hlo_dir / "log-neuron-cc.txt").read_text()
    assert log.endswith("..") and "Compiler status" not in log


def test_cc_fail_times_and_calls(hlo_dir):
    calls, counter = hlo_dir / "calls.jsonl", hlo_dir / "count"
    env = neuron_env(fail="transient", fail_times=2, counter=counter, calls=calls)
    env["NEURON_CC_FLAGS"] = "--optlevel 1"
    codes = [cc(["compile", "model", "--output", "g.neff"], env, hlo_dir).returncode for _ in range(3)]
    assert codes == [70, 70, 0]
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [r["fail"] for r in records] == ["transient", "transient", None]
    assert records[0]["argv"][:3] == ["neuronx-cc", "compile", "model"]
    assert records[0]["cwd"] == str(hlo_dir) and records[0]["NEURON_CC_FLAGS"] == "--optlevel 1"
    assert counter.read_text() == "3"
    # fail_times without a fail mode means transient; without a counter it is a setup error
    assert cc(["compile", "model"], neuron_env(fail_times=1, counter=hlo_dir / "c2"), hlo_dir).returncode == 70
    assert cc(["compile", "model"], neuron_env(fail_times=1), hlo_dir).returncode == 2


# --------------------------------------------------------------------------- torch_neuronx

TRACE_SCRIPT = """
    import json, os, torch, torch_neuronx
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(2, 4)
    result = {}
    neuron = torch_neuronx.trace(model, x, compiler_workdir="wd", compiler_args=["--target", "trn1"],
                                 cpu_backend=True)
    result["type"] = type(neuron).__mro__[1].__name__
    result["is_script_module"] = isinstance(neuron, torch.jit.ScriptModule)
    result["close"] = bool(torch.allclose(neuron(x), model(x)))
    result["requires_grad"] = neuron(x).requires_grad

    def two_in_two_out(ids, mask):
        return {"a": ids + 1, "b": (ids * mask).sum(-1)}

    ids, mask = torch.arange(6).reshape(2, 3), torch.ones(2, 3, dtype=torch.int64)
    fn = torch_neuronx.trace(two_in_two_out, (ids, mask), compiler_workdir="wd2",
                             compiler_args=["--target=inf2", "--logfile=wd2/log.txt"], cpu_backend=True)
    out = fn(ids, mask)
    result["fn_out"] = {k: v.tolist() for k, v in out.items()}
    try:
        fn(ids, mask.bool())
    except RuntimeError as exc:
        result["fn_refused"] = [l for l in str(exc).splitlines() if "Neuron model input" in l][0]
    for bad in (torch.randn(3, 4), x.double()):
        try:
            neuron(bad)
            result.setdefault("refused", []).append(None)
        except RuntimeError as exc:
            result.setdefault("refused", []).append(
                [l for l in str(exc).splitlines() if "Neuron model input" in l][0])
    torch.jit.save(neuron, "neuron.pt")
    torch.save({"x": x, "y": model(x).detach()}, "io.pt")
    result["analyze"] = torch_neuronx.analyze(model, x)

    def error(**kwargs):
        try:
            torch_neuronx.trace(model, x, **kwargs)
        except Exception as exc:
            return [type(exc).__name__, str(exc)]
        return None

    result["no_target"] = error(cpu_backend=True)
    result["no_device"] = error(compiler_args=["--target", "trn1"])
    for mode in ("xcg815", "transient", "sigkill"):
        os.environ["FAKE_NEURONX_CC_FAIL"] = mode
        result[mode] = error(cpu_backend=True, compiler_args="--target trn1")
    del os.environ["FAKE_NEURONX_CC_FAIL"]
    result["temp_ok"] = error(cpu_backend=True, compiler_args="--target inf2")
    print(json.dumps(result))
"""

LOAD_SCRIPT = """
    import json, torch
    result = {}
    try:
        torch.jit.load("neuron.pt")
        result["load_without_import"] = "loaded"
    except Exception as exc:
        result["load_without_import"] = type(exc).__name__
    import torch_neuronx
    neuron = torch.jit.load("neuron.pt")
    io = torch.load("io.pt")
    result["close"] = bool(torch.allclose(neuron(io["x"]), io["y"]))
    result["requires_grad"] = neuron(io["x"]).requires_grad
    result["neff_bytes"] = neuron.neff.numel()
    refused = []
    for bad in (torch.randn(2, 5), io["x"].half(), torch.zeros(2, 4, dtype=torch.int64)):
        try:
            neuron(bad)
            refused.append(None)
        except RuntimeError as exc:
            refused.append([l for l in str(exc).splitlines() if "Neuron model input" in l][0])
    result["refused"] = refused
    print(json.dumps(result))
"""


def test_trace_save_load_and_failures(tmp_path):
    calls = tmp_path / "calls.jsonl"
    result = run_py(TRACE_SCRIPT, neuron_env(calls=calls), tmp_path)
    assert result["is_script_module"] and result["close"] and result["requires_grad"] is False
    assert result["fn_out"] == {"a": [[1, 2, 3], [4, 5, 6]], "b": [3, 12]}
    assert "input 1: expected shape [2, 3] dtype int64, got shape [2, 3] dtype bool" in result["fn_refused"]
    assert (tmp_path / "wd2" / "log.txt").read_text().endswith("Compiler status PASS\n")
    assert "input 1 s64[2,3]" in (tmp_path / "wd2" / "model" / "graph.hlo").read_text()
    assert ("Neuron model input 0: expected shape [2, 4] dtype float32, got shape [3, 4] dtype float32"
            in result["refused"][0])
    assert "got shape [2, 4] dtype float64" in result["refused"][1]
    wd = tmp_path / "wd"
    assert sorted(p.name for p in wd.iterdir()) == ["command.txt", "graph.neff", "model"]
    # like the real wrapper: the compiler runs in the caller's cwd, so the log lands there
    log = (tmp_path / "log-neuron-cc.txt").read_text()
    assert log.splitlines()[-1] == "Compiler status PASS"
    assert (wd / "command.txt").read_text() == (
        "neuronx-cc compile model --framework XLA --target trn1 --output graph.neff --target trn1")
    hlo = (wd / "model" / "graph.hlo").read_text().splitlines()
    assert [line for line in hlo if line.startswith("op ")] == [
        "op 0 aten::linear f32[2,3]", "op 1 aten::relu f32[2,3]"]
    assert "input 0 f32[2,4]" in hlo and "param 0 0.weight f32[3,4] inline" in hlo
    neff = read_neff(wd / "graph.neff")
    assert neff["header_size"] == 1024 and neff["data_size"] == neff["file_size"] - 1024
    assert neff["major"] == 2 and neff["build"] == CC_VERSION
    assert sorted(neff["members"]) == ["neff.json", "sg00/instructions.bin", "sg00/ops.txt",
                                       "weights/0.npy", "weights/1.npy"]
    assert result["analyze"] == {
        "torch_neuronx_version": "2.13.0.2.30.4217", "neuronx_cc_version": CC_VERSION,
        "support_percentage": "100.00%",
        "supported_operators": {"aten::linear": 1, "aten::relu": 1}, "unsupported_operators": [],
    }
    assert result["no_target"][0] == "ValueError" and "--target" in result["no_target"][1]
    assert result["no_device"][0] == "RuntimeError" and "no Neuron device" in result["no_device"][1]
    assert result["xcg815"] == ["RuntimeError", "neuronx-cc failed with 1"]
    assert result["transient"] == ["RuntimeError", "neuronx-cc failed with 70"]
    assert result["sigkill"] == ["RuntimeError", "neuronx-cc failed with -9"]
    assert result["temp_ok"] is None
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(records) == 6  # analyze does not compile
    temp_neff = Path(records[-1]["argv"][records[-1]["argv"].index("--output") + 1])
    assert not temp_neff.parent.exists()  # the temporary workdir was deleted

    loaded = run_py(LOAD_SCRIPT, neuron_env(), tmp_path)
    assert loaded["load_without_import"] == "RuntimeError"
    assert loaded["close"] and loaded["neff_bytes"] == neff["file_size"]
    assert loaded["requires_grad"] is False
    assert all(r and "Neuron model input 0: expected shape [2, 4] dtype float32" in r
               for r in loaded["refused"])
    assert "got shape [2, 5] dtype float32" in loaded["refused"][0]
    assert "got shape [2, 4] dtype float16" in loaded["refused"][1]
    assert "got shape [2, 4] dtype int64" in loaded["refused"][2]


SIGNATURE_SCRIPT = """
    import inspect, json, torch, torch_neuronx
    params = list(inspect.signature(torch_neuronx.trace).parameters)
    result = {"params": params}
    model = torch.nn.Linear(4, 2).eval()
    try:
        torch_neuronx.trace(model, torch.randn(1, 4), cpu_backend=True, compiler_args="--target trn1")
        result["cpu_backend"] = "accepted"
    except TypeError:
        result["cpu_backend"] = "TypeError"
    print(json.dumps(result))
"""


def test_trace_signature_versions(tmp_path):
    procs = {}
    for signature in ("2.7", "2.16", "2.21"):
        procs[signature] = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(SIGNATURE_SCRIPT)],
            env=neuron_env(signature=signature), cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    results = {}
    for signature, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results[signature] = json.loads(out.strip().splitlines()[-1])
    assert results["2.7"]["params"] == ["func", "example_inputs", "compiler_workdir", "compiler_args"]
    assert results["2.16"]["params"] == ["func", "example_inputs", "_", "input_output_aliases",
                                         "compiler_workdir", "compiler_args", "partitioner_config",
                                         "inline_weights_to_neff"]
    assert results["2.21"]["params"] == results["2.16"]["params"] + ["cpu_backend"]
    assert results["2.7"]["cpu_backend"] == "TypeError"
    assert results["2.16"]["cpu_backend"] == "TypeError"
    assert results["2.21"]["cpu_backend"] == "accepted"


PARALLEL_SCRIPT = """
    import json, os, torch
    from neuronx_distributed.trace import parallel_model_trace, parallel_model_save, parallel_model_load
    torch.manual_seed(0)
    base = torch.nn.Linear(4, 3).eval()
    built = []
    def factory():
        built.append(1)
        return base, {}
    x = torch.randn(2, 4)
    model = parallel_model_trace(factory, (x,), compiler_workdir="wd", compiler_args="--target trn1",
                                 tp_degree=2)
    parallel_model_save(model, "saved")
    loaded = parallel_model_load("saved")
    os.environ.pop("FAKE_NEURON_HAS_DEVICE")
    try:
        parallel_model_trace(factory, (x,), tp_degree=2)
        no_device = None
    except RuntimeError as exc:
        no_device = str(exc)
    print(json.dumps({
        "built": len(built), "close": bool(torch.allclose(loaded(x), base(x))),
        "close_traced": bool(torch.allclose(model(x), base(x))),
        "saved": sorted(os.listdir("saved")), "no_device": no_device,
    }))
"""


def test_parallel_model_trace(tmp_path):
    calls = tmp_path / "calls.jsonl"
    result = run_py(PARALLEL_SCRIPT, neuron_env(has_device=True, calls=calls), tmp_path)
    assert result["built"] == 2 and result["close"] and result["close_traced"]
    assert result["saved"] == ["tp_0.pt", "tp_1.pt"]
    assert "no Neuron device" in result["no_device"]
    for rank in (0, 1):
        rank_dir = tmp_path / "wd" / f"_tp{rank}"
        assert {"graph.neff", "command.txt", "log-neuron-cc.txt", "metaneff.pb", "model"} <= {
            p.name for p in rank_dir.iterdir()}
        assert read_neff(rank_dir / "graph.neff")["major"] == 2
    assert len(calls.read_text().splitlines()) == 2


# --------------------------------------------------------------------------- other variants

def test_placeholder_has_no_trace(tmp_path):
    code = """
        import importlib.metadata as md, json, shutil, torch_neuronx
        print(json.dumps({"trace": hasattr(torch_neuronx, "trace"), "doc": torch_neuronx.__doc__,
                          "versions": {n: md.version(n) for n in ("torch-neuronx", "neuronx-cc",
                                       "neuronx-distributed", "libneuronxla")},
                          "cc": shutil.which("neuronx-cc")}))
    """
    result = run_py(code, neuron_env("placeholder"), tmp_path)
    assert result["trace"] is False and "pip.repos.neuron.amazonaws.com" in result["doc"]
    assert result["versions"] == {"torch-neuronx": "1.0", "neuronx-cc": "1.0.post1",
                                  "neuronx-distributed": "1.0", "libneuronxla": "1.0"}
    assert result["cc"] is None or not result["cc"].startswith(str(FAKES))


def test_other_torch_variant(tmp_path):
    code = """
        import importlib.metadata as md, json, torch, torch_neuronx
        import neuronx_distributed.trace
        print(json.dumps({"requires": md.requires("torch-neuronx"), "version": torch_neuronx.__version__,
                          "trace": callable(torch_neuronx.trace),
                          "nxd": callable(neuronx_distributed.trace.parallel_model_trace)}))
    """
    result = run_py(code, neuron_env("other_torch"), tmp_path)
    assert "torch==2.1.*" in result["requires"]
    assert result["version"] == "2.1.2.2.30.4217" and result["trace"] and result["nxd"]


def test_activate_in_process(monkeypatch, tmp_path):
    """fakes.env.activate: import the double in this process, switch signature, re-import."""
    import torch  # a dependency of the package: never skipped
    fakes_env.activate(monkeypatch, "neuron_sdk", signature="2.16", has_device=True)
    import inspect

    import torch_neuronx
    assert "cpu_backend" not in inspect.signature(torch_neuronx.trace).parameters
    fakes_env.activate(monkeypatch, "neuron_sdk", signature="2.21")
    import torch_neuronx as again
    assert again is not torch_neuronx
    assert "cpu_backend" in inspect.signature(again.trace).parameters
    monkeypatch.chdir(tmp_path)
    neuron = again.trace(torch.nn.Linear(2, 2).eval(), torch.ones(1, 2), cpu_backend=True,
                         compiler_args=["--target", "trn1"], compiler_workdir=tmp_path / "wd")
    assert neuron(torch.ones(1, 2)).shape == (1, 2)
    assert (tmp_path / "wd" / "graph.neff").exists()
