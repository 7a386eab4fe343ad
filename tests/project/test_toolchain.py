"""Toolchain detection, `neuron-build doctor`, and the `auto` backend's one fallback note."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuron_build.project import toolchain
from neuron_build.project.toolchain import (
    compiler_executable,
    neuron_status,
    resolve_backend,
    torch_matches,
    torch_requirement,
)
from tests.fakes.env import FAKES_DIR, activate, neuron_env
from tests.helpers.cli import REPO, run_cli
from tests.helpers.projects import edit, write_tiny_project

TORCH = toolchain.version("torch")
CC_VERSION = "2.30.4217.0+5e1f0c2a"
HOW = ("install the real toolchain from AWS's Neuron package index (pip install --extra-index-url "
       "https://pip.repos.neuron.amazonaws.com neuronx-cc==2.* torch-neuronx neuronx-distributed; see "
       "\"On a Neuron host\" in README.md).")
MISSING = f"The Neuron toolchain is not installed (no torch-neuronx package); {HOW}"
PLACEHOLDER = ("The Neuron toolchain is not installed (found the PyPI placeholder: torch-neuronx 1.0, neuronx-cc "
               f"1.0.post1); uninstall them and {HOW}")
MISMATCH = (f"The installed torch-neuronx 2.1.2.2.30.4217 is built for torch==2.1.* but torch {TORCH} is installed; "
            f"install the torch-neuronx release for torch {TORCH} (or the torch it requires) from AWS's Neuron "
            "package index (https://pip.repos.neuron.amazonaws.com; see \"On a Neuron host\" in README.md).")


@pytest.fixture
def variant(monkeypatch):
    def use(name, **switches):
        activate(monkeypatch, name, **switches)
        toolchain.clear_caches()
        return neuron_status()
    yield use
    toolchain.clear_caches()


def test_status_of_each_variant(variant):
    st = variant(None)
    assert (st.usable, st.kind, st.problem) == (False, "missing", MISSING)
    assert st.versions == dict.fromkeys(toolchain.NEURON_DISTS)
    st = variant("placeholder")
    assert (st.usable, st.kind, st.problem) == (False, "placeholder", PLACEHOLDER)
    st = variant("other_torch")
    assert (st.usable, st.kind, st.problem) == (False, "torch_mismatch", MISMATCH)
    assert st.torch_requirement == "==2.1.*"
    st = variant("neuron_sdk")
    assert (st.usable, st.kind, st.problem, st.torch_requirement) == (True, "ok", None, "==2.13.*")
    assert st.versions == {"torch-neuronx": "2.13.0.2.30.4217", "neuronx-cc": CC_VERSION,
                           "neuronx-distributed": "0.17.4217", "libneuronxla": "2.3.4217.0"}
    assert st.verdict == (f"The Neuron toolchain is installed: torch-neuronx 2.13.0.2.30.4217 with neuronx-cc "
                          f"{CC_VERSION} for torch {TORCH}.")
    assert resolve_backend("auto") == ("neuron", None)
    assert toolchain.toolchain_versions("neuron") == {"torch": TORCH, **st.versions}
    assert toolchain.toolchain_versions("inductor") == {"torch": TORCH}
    variant("placeholder")
    assert resolve_backend("auto") == ("inductor", "backend auto: using inductor because t" + PLACEHOLDER[1:])
    assert resolve_backend("torchscript") == ("torchscript", None)


def test_torch_requirement_matching():
    assert torch_matches("==2.13.*", "2.13.0+cpu") and torch_matches("==2.13.*", "2.13.1")
    assert not torch_matches("==2.1.*", "2.13.0+cpu") and not torch_matches("==2.1.*", "2.10.0")
    assert torch_matches(">=2.1,<2.14", "2.13.0") and not torch_matches(">=2.1,<2.13", "2.13.0")
    assert torch_matches("not a spec", "2.13.0")  # nothing reported that cannot be shown
    assert torch_requirement("no-such-distribution") is None


def test_compiler_executable(variant, monkeypatch):
    variant("neuron_sdk")
    exe = compiler_executable()
    assert exe.path == str(FAKES_DIR / "bin" / "neuronx-cc") and exe.version == CC_VERSION and exe.error is None
    variant(None)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert compiler_executable() == toolchain.CompilerExecutable(None, error="neuronx-cc is not on PATH")


def test_neuron_status_never_imports(variant):
    code = ("import sys, neuron_build.project.toolchain as t; st = t.neuron_status(); "
            "print(st.kind, any(m in sys.modules for m in ('torch', 'torch_neuronx', 'neuronxcc')))")
    out = subprocess.run([sys.executable, "-c", code], env=neuron_env("neuron_sdk"), capture_output=True, text=True,
                         cwd=REPO)
    assert out.stdout.split() == ["ok", "False"], out.stderr


# --------------------------------------------------------------------------- doctor

def doctor(env, *args) -> subprocess.CompletedProcess:
    return run_cli("doctor", *args, env=env)


def test_doctor_on_this_machine_says_not_installed_in_one_sentence(tmp_path):
    r = doctor(neuron_env(None))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == MISSING
    assert lines[:-1] == [
        f"torch                {TORCH}",
        "torch-neuronx        not installed",
        "neuronx-cc           not installed",
        "neuronx-distributed  not installed",
        "libneuronxla         not installed",
        "neuronx-cc on PATH   not found",
        "Neuron devices       none (/dev/neuron* not found)",
        "backend auto         inductor",
    ]


def test_doctor_placeholder_and_torch_mismatch():
    r = doctor(neuron_env("placeholder"))
    assert r.returncode == 0
    assert r.stdout.splitlines() == [
        f"torch                {TORCH}",
        "torch-neuronx        1.0",
        "neuronx-cc           1.0.post1",
        "neuronx-distributed  1.0",
        "libneuronxla         1.0",
        "neuronx-cc on PATH   not found",
        "Neuron devices       none (/dev/neuron* not found)",
        "backend auto         inductor",
        PLACEHOLDER,
    ]
    r = doctor(neuron_env("other_torch"))
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == MISMATCH
    assert "2.1.2.2.30.4217 (built for torch==2.1.*)" in r.stdout
    assert f"neuronx-cc --version  {CC_VERSION}" in r.stdout


def test_doctor_json_with_the_sdk():
    r = doctor(neuron_env("neuron_sdk"), "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep == {
        "schema": "neuron-build/doctor/v1",
        "torch": TORCH,
        "packages": {"torch-neuronx": "2.13.0.2.30.4217", "neuronx-cc": CC_VERSION,
                     "neuronx-distributed": "0.17.4217", "libneuronxla": "2.3.4217.0"},
        "torch_neuronx_requires_torch": "==2.13.*",
        "neuronx_cc_executable": {"path": str(FAKES_DIR / "bin" / "neuronx-cc"), "version": CC_VERSION,
                                  "error": None},
        "neuron_devices": [],
        "auto_backend": "neuron",
        "auto_backend_by_target": {"trn1": "neuron", "trn2": "neuron", "trn3": "neuron"},
        "torch_neuronx_api": "xla",
        "torch_neuronx_api_detail": "XLA torch-neuronx (torch_neuronx.trace): backend neuron",
        "usable": True,
        "kind": "ok",
        "verdict": f"The Neuron toolchain is installed: torch-neuronx 2.13.0.2.30.4217 with neuronx-cc "
                   f"{CC_VERSION} for torch {TORCH}.",
    }


# --------------------------------------------------------------------------- auto

NOTE = "backend auto: using inductor because the Neuron toolchain is not installed (no torch-neuronx package)"


def test_auto_falls_back_to_inductor_and_says_so_once(tmp_path):
    cfg = write_tiny_project(tmp_path / "proj")
    edit(cfg, 'backend = "torchscript"', 'backend = "auto"')
    edit(cfg, 'factory = "tinylib.other:build"', 'factory = "tinylib.tiny:broken"')  # fails fast in the worker
    env = neuron_env(None)
    r = run_cli("plan", "-c", str(cfg), env=env)
    assert r.returncode == 0
    assert (r.stdout + r.stderr).count(NOTE) == 0  # not on read commands
    r = run_cli("build", "-c", str(cfg), "other", env=env)
    assert r.returncode == 1
    assert (r.stdout + r.stderr).count(NOTE) == 1
    (line,) = [ln for ln in r.stderr.splitlines() if NOTE in ln]
    assert "pip install" not in line  # one short line; doctor says how to install
    assert "FAILED other/static/fp32/p1: ERROR: RuntimeError: factory exploded on purpose" in r.stdout
    events = [json.loads(ln) for ln in (cfg.parent / ".neuron-build" / "build.log").read_text().splitlines()]
    notes = [e["event"] for e in events if e["event"].startswith("backend auto:")]
    assert notes == [f"{NOTE}; `neuron-build doctor` shows how to install it"]  # the build only
    compiling = [e for e in events if e["event"] == "compiling"]
    assert [e["backend"] for e in compiling] == ["inductor"]
    # doit itself: one note per run as well
    (cfg.parent / "dodo.py").write_text("from neuron_build.tasks import *\n")
    d = subprocess.run([sys.executable, "-m", "doit", "list"], cwd=cfg.parent, env=env, capture_output=True,
                       text=True)
    assert d.returncode == 0, d.stderr
    assert (d.stdout + d.stderr).count(NOTE) == 0  # doit list builds nothing
