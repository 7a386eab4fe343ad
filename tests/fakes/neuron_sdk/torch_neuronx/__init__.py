"""Test double of AWS Neuron's torch-neuronx (neuron-build tests/fakes; see tests/fakes/README.md)."""

__version__ = "2.13.0.2.30.4217"

from torch_neuronx._fake_impl import (  # noqa: E402
    SIGNATURE as _FAKE_SIGNATURE,
    NeuronModule,
    analyze,
    move_trace_to_device,
    replace_weights,
    trace,
)

__all__ = ["trace", "analyze", "move_trace_to_device", "replace_weights", "NeuronModule"]
