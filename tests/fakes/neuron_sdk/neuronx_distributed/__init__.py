"""Test double of neuronx-distributed: only `neuronx_distributed.trace` (see tests/fakes/README.md)."""

__version__ = "0.17.4217"
