"""Test double of the neuronx-cc distribution's Python package (import name `neuronxcc`).

The compiler itself is the `neuronx-cc` executable: tests/fakes/bin/neuronx-cc.
"""

__version__ = "2.30.4217.0+5e1f0c2a"  # keep equal to COMPILER_VERSION in tests/fakes/fake_neuronx_cc.py
