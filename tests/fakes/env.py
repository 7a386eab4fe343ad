"""Environments that put the Neuron test double in front of a subprocess (or this process).

    from tests.fakes.env import neuron_env    # the checkout's root on sys.path
    env = neuron_env("neuron_sdk", fail="transient", fail_times=1, counter=tmp_path / "n")
    subprocess.run([...], env=env)

Standard library only. See tests/fakes/README.md for the variants and every switch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

FAKES_DIR = Path(__file__).resolve().parent
BIN_DIR = FAKES_DIR / "bin"
VARIANTS = ("neuron_sdk", "other_torch", "placeholder", "torchneuron_sdk")
# Variants that ship the neuronx-cc executable (the PyPI placeholder has none).
_WITH_COMPILER = ("neuron_sdk", "other_torch", "torchneuron_sdk")

# keyword -> environment variable
SWITCHES = {
    "signature": "FAKE_TORCH_NEURONX_SIGNATURE",   # "2.7" | "2.16" | "2.21" (default)
    "has_device": "FAKE_NEURON_HAS_DEVICE",          # True: a NeuronCore "exists"
    "run_needs_device": "FAKE_NEURON_RUN_NEEDS_DEVICE",  # True: calling a traced model needs one
    "unsupported": "FAKE_TORCH_NEURONX_UNSUPPORTED",  # "aten::relu,aten::sort" for analyze()
    "log_format": "FAKE_NEURONX_CC_LOG_FORMAT",      # "pass" (default) | "summary" | "verbose" | "old"
    "fail": "FAKE_NEURONX_CC_FAIL",                  # xcg815 eoom evrf euoc internal transient sigkill hang nonutf8
    "fail_times": "FAKE_NEURONX_CC_FAIL_TIMES",      # fail only the first N compiles (needs counter)
    "counter": "FAKE_NEURONX_CC_COUNTER",            # file holding the compile count for fail_times
    "sleep": "FAKE_NEURONX_CC_SLEEP",                # seconds of fake compile time
    "calls": "FAKE_NEURONX_CC_CALLS",                # file: one JSON line per compile
    "mem_mb": "FAKE_NEURONX_CC_MEM_MB",              # MB the compiler holds while compiling
    "hang_max": "FAKE_NEURONX_CC_HANG_MAX",          # seconds a "hang" lasts at most (default 600)
    "cc_version": "FAKE_NEURONX_CC_VERSION",         # the version neuronx-cc reports (default: the package's)
    "split": "FAKE_TORCH_NEURONX_SPLIT",             # "0": torch_neuronx.xla_impl.trace has no split functions
    "nxdi_cache_calls": "FAKE_NXDI_CACHE_CALLS",     # file: one JSON line per NxDI bucket: cache hit or compile
    # torchneuron_sdk (the native TorchNeuron double)
    "torchneuron_fail": "FAKE_TORCHNEURON_FAIL",     # "compile": every graph compile fails
    "graph_break": "FAKE_TORCHNEURON_GRAPH_BREAK",   # True: every module call breaks the graph
    "torchneuron_sleep": "FAKE_TORCHNEURON_SLEEP",   # seconds per graph compile
    "torchneuron_calls": "FAKE_TORCHNEURON_CALLS",   # file: one JSON line per graph compile or cache hit
}


def variant_root(variant: str) -> str:
    """The sys.path root of a variant (for sys.path / monkeypatch.syspath_prepend)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown fake Neuron variant {variant!r}; one of {VARIANTS}")
    return str(FAKES_DIR / variant)


def _strip(value: str, remove: set) -> list:
    return [p for p in value.split(os.pathsep) if p and os.path.abspath(p) not in remove]


def neuron_env(variant: str | None = "neuron_sdk", *, base: Mapping[str, str] | None = None,
               **switches) -> dict:
    """A copy of `base` (default os.environ) set up for the test double.

    variant: "neuron_sdk", "other_torch", "placeholder", "torchneuron_sdk" (TorchNeuron, the native
        backend), or None (no toolchain at all).
    switches: keywords of SWITCHES (or FAKE_* names verbatim). True -> "1"; False/None -> unset.
    Any FAKE_* variable already in `base` is dropped first, so the result is hermetic.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("FAKE_")}
    roots = {str(FAKES_DIR / v) for v in VARIANTS}
    python_path = _strip(env.get("PYTHONPATH", ""), roots)
    path = _strip(env.get("PATH", os.defpath), {str(BIN_DIR)})
    if variant is not None:
        python_path.insert(0, variant_root(variant))
        if variant in _WITH_COMPILER:
            path.insert(0, str(BIN_DIR))
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(python_path)
    else:
        env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join(path)
    env["FAKE_NEURON_PYTHON"] = sys.executable
    for key, value in switches.items():
        name = key if key.startswith("FAKE_") else SWITCHES.get(key)
        if name is None:
            raise TypeError(f"neuron_env() got an unknown switch {key!r}; known: {sorted(SWITCHES)}")
        if value is None or value is False:
            env.pop(name, None)
        elif value is True:
            env[name] = "1"
        else:
            env[name] = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
    return env


_MODULES = ("torch_neuronx", "neuronxcc", "neuronx_distributed", "libneuronxla")


def activate(monkeypatch, variant: str | None = "neuron_sdk", **switches) -> dict:
    """Apply neuron_env() to THIS process with pytest's monkeypatch (undone after the test).

    Sets the environment (so subprocesses such as neuronx-cc see it), prepends the variant root to
    sys.path and forgets already-imported fake modules so the next import sees the variant and
    FAKE_TORCH_NEURONX_SIGNATURE. Returns the environment it applied.
    """
    env = neuron_env(variant, **switches)
    for key in [k for k in os.environ if k.startswith("FAKE_") and k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    if variant is not None:
        monkeypatch.syspath_prepend(variant_root(variant))
    for name in list(sys.modules):
        if name.split(".")[0] in _MODULES:
            monkeypatch.delitem(sys.modules, name)
    return env
