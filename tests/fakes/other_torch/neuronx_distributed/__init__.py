"""Test double of neuronx-distributed (other_torch variant; code shared with neuron_sdk)."""

import os as _os

__path__.append(_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.dirname(
    _os.path.abspath(__file__)))), "neuron_sdk", "neuronx_distributed"))

__version__ = "0.17.4217"
