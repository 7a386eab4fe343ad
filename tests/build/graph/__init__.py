"""Tests of ``neuron_build/build/graph``."""
