"""Test double of libneuronxla (version only)."""

__version__ = "2.3.4217.0"
