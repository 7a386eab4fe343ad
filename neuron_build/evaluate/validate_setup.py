"""Two torch-free facts of a target's validation, from its key and its manifest.

Part of :mod:`neuron_build.evaluate.validate` (which re-exports both names): the seed of the validation
inputs (:func:`validation_seed`) and the device kind the artifact runs on (:func:`artifact_device_kind`).
Their own module so that :mod:`neuron_build.evaluate.validate_run` reads them without importing
:mod:`neuron_build.evaluate.validate`, which imports it.
"""

from __future__ import annotations

from neuron_build.backends import find_backend


def validation_seed(key: str) -> int:
    """The seed of a target's validation (and benchmark) inputs: hex digits 8-15 of its key, an int in
    [0, 2**32). The compile's example inputs use digits 0-7, so validation runs on other values."""
    return int(key[8:16], 16)


def artifact_device_kind(backend: str, hardware_target: str) -> str:
    """The device kind an artifact runs on: its backend record's
    (:meth:`neuron_build.backends.BackendSpec.device_kind`): ``neuron`` for the neuron and torchneuron
    backends, else ``cuda`` or ``cpu`` (the ``[build] device`` the inductor, compile-cache or torchscript
    backend compiled for). An unknown backend (a manifest this version did not write): ``cuda`` for a
    ``cuda`` target, else ``cpu``."""
    spec = find_backend(backend)
    if spec is not None:
        return spec.device_kind(hardware_target)
    return "cuda" if hardware_target == "cuda" else "cpu"


__all__ = ["artifact_device_kind", "validation_seed"]
