"""``neuron-build doctor [--json]``: what this host has of the Neuron toolchain, and one verdict.

Needs no ``buckets.toml``. Reads package metadata, runs ``neuronx-cc --version`` when the executable is
on PATH, lists ``/dev/neuron*``, and tells the two torch-neuronx products apart by API (XLA: has
``torch_neuronx.trace``; native TorchNeuron: registers the ``neuron`` device) in a fresh interpreter;
never imports torch or the Neuron packages itself. Always exits 0: the verdict
is the answer (``usable`` in the JSON for scripts).
"""

from __future__ import annotations

from typing import Any

from neuron_build.cli.app import command, display_text, print_json
from neuron_build.errors import ExitCode
from neuron_build.project.toolchain import (
    NEURON_DISTS,
    TORCHNEURON_TARGETS,
    compiler_executable,
    neuron_devices,
    neuron_status,
    resolve_backend,
    torch_neuronx_api,
)

__all__ = ["register", "doctor_report", "format_report", "cmd_doctor"]


def register(add) -> None:
    """Add the ``doctor`` sub-command."""
    s = add("doctor", "show the Neuron toolchain this host has (packages, neuronx-cc, devices) and what "
                      "backend auto picks")
    s.add_argument("--json", action="store_true")


def doctor_report() -> dict[str, Any]:
    """The facts ``doctor`` prints.

    Returns:
        ``{"torch", "packages": {dist: version|None}, "torch_neuronx_requires_torch", "neuronx_cc_executable":
        {"path", "version", "error"}, "neuron_devices": [paths], "auto_backend" (for target trn1),
        "auto_backend_by_target", "torch_neuronx_api" (``xla``, ``native`` or ``none``, probed in a fresh
        interpreter when the toolchain is usable, else None) and its detail, "usable", "kind", "verdict"}``; ``kind`` as in :class:`neuron_build.project.toolchain.NeuronStatus`, ``verdict`` one sentence.
    """
    st = neuron_status()
    exe = compiler_executable()
    backend, _note = resolve_backend("auto", "trn1")
    api = torch_neuronx_api() if st.usable else None
    return {
        "torch": st.torch,
        "packages": {d: st.versions[d] for d in NEURON_DISTS},
        "torch_neuronx_requires_torch": st.torch_requirement,
        "neuronx_cc_executable": {"path": exe.path, "version": exe.version, "error": exe.error},
        "neuron_devices": neuron_devices(),
        "auto_backend": backend,
        "auto_backend_by_target": {t: resolve_backend("auto", t)[0] for t in ("trn1", *TORCHNEURON_TARGETS)},
        "torch_neuronx_api": api.kind if api else None,
        "torch_neuronx_api_detail": api.description if api else None,
        "usable": st.usable,
        "kind": st.kind,
        "verdict": st.verdict,
    }


def format_report(r: dict[str, Any]) -> str:
    """The human-readable form of :func:`doctor_report`, ending with the verdict line."""
    rows = [("torch", r["torch"] or "not installed")]
    for dist, v in r["packages"].items():
        text = v or "not installed"
        if dist == "torch-neuronx" and v and r["torch_neuronx_requires_torch"]:
            text += f" (built for torch{r['torch_neuronx_requires_torch']})"
        rows.append((dist, text))
    exe = r["neuronx_cc_executable"]
    if exe["path"] is None:
        rows.append(("neuronx-cc on PATH", "not found"))
    else:
        rows.append(("neuronx-cc on PATH", exe["path"]))
        rows.append(("neuronx-cc --version", exe["version"] or exe["error"] or "unknown"))
    devs = r["neuron_devices"]
    rows.append(("Neuron devices", f"{len(devs)}: {' '.join(devs)}" if devs else "none (/dev/neuron* not found)"))
    if r.get("torch_neuronx_api"):
        rows.append(("torch-neuronx API", r["torch_neuronx_api_detail"]))
    by = r.get("auto_backend_by_target") or {}
    if len(set(by.values())) > 1:
        rows.append(("backend auto", ", ".join(f"{t}: {b}" for t, b in by.items())))
    else:
        rows.append(("backend auto", r["auto_backend"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows) + "\n" + r["verdict"] + "\n"


@command("doctor")
def cmd_doctor(args) -> int:
    """Print what was found of the Neuron toolchain and the one-sentence verdict."""
    report = doctor_report()
    if args.json:
        print_json(report)
    else:
        display_text(format_report(report), end="")
    return ExitCode.OK
