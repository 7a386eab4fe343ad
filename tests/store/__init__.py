"""Tests of ``neuron_build/store``."""
