"""Which compilers this host has, found without importing them (no torch import on the no-op path).

Versions come from installed package metadata (``importlib.metadata``). The Neuron toolchain is
recognised as the real one only when ``torch-neuronx`` is installed and is not PyPI's placeholder: the
placeholders are version 1.0 / 1.0.post1 packages whose module has no ``trace`` [doc: toolchain notes].
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
from dataclasses import dataclass
from functools import lru_cache

NEURON_INSTALL_HINT = ("install the real toolchain from AWS's Neuron package index (see \"On a Neuron host\" "
                       "in README.md)")


@lru_cache(maxsize=None)
def version(dist: str) -> str | None:
    """Installed version of a distribution, or None when it is not installed. Cached per process."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class NeuronStatus:
    """What was found of the Neuron toolchain.

    ``usable`` is True only for a real, importable torch-neuronx; ``problem`` is one sentence saying why
    not, including how to install the real toolchain.
    """

    usable: bool
    problem: str | None
    versions: dict[str, str | None]


def neuron_status() -> NeuronStatus:
    """Detect torch-neuronx, neuronx-cc, neuronx-distributed and libneuronxla from package metadata.

    Never imports them; the worker imports torch_neuronx and reports a placeholder module without
    ``trace`` in detail.
    """
    versions = {d: version(d) for d in ("torch-neuronx", "neuronx-cc", "neuronx-distributed", "libneuronxla")}
    tnx = versions["torch-neuronx"]
    if tnx is None or importlib.util.find_spec("torch_neuronx") is None:
        return NeuronStatus(False, f"the Neuron toolchain is not installed (no torch-neuronx); {NEURON_INSTALL_HINT}",
                            versions)
    if tnx.startswith("1.0") or (versions["neuronx-cc"] or "").startswith("1.0"):
        return NeuronStatus(False, "the Neuron toolchain is not installed (found the PyPI placeholder "
                                   f"torch-neuronx {tnx}); {NEURON_INSTALL_HINT}", versions)
    return NeuronStatus(True, None, versions)


def resolve_backend(requested: str) -> tuple[str, str | None]:
    """Resolve ``auto`` to ``neuron`` when the real toolchain is usable, else ``inductor``.

    Returns:
        (backend, note): ``note`` says why ``auto`` fell back, else None.
    """
    if requested != "auto":
        return requested, None
    st = neuron_status()
    if st.usable:
        return "neuron", None
    return "inductor", f"backend auto: using inductor because {st.problem}"


def toolchain_versions(backend: str) -> dict[str, str | None]:
    """The compiler versions that are part of the key and the manifest for ``backend``."""
    out: dict[str, str | None] = {"torch": version("torch")}
    if backend == "neuron":
        out.update(neuron_status().versions)
    return out
