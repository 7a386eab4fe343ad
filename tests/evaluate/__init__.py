"""Tests of ``neuron_build/evaluate``."""
