"""Test double of a torch-neuronx built for torch 2.1 (METADATA pins torch==2.1.*).

Shares the implementation in tests/fakes/neuron_sdk/torch_neuronx by extending this package's path.
"""

import os as _os

__path__.append(_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(
    _os.path.abspath(__file__)))), "neuron_sdk", "torch_neuronx"))

__version__ = "2.1.2.2.30.4217"

from torch_neuronx._fake_impl import (  # noqa: E402
    SIGNATURE as _FAKE_SIGNATURE,
    NeuronModule,
    analyze,
    move_trace_to_device,
    trace,
)

__all__ = ["trace", "analyze", "move_trace_to_device", "NeuronModule"]
