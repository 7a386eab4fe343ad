"""Tests of ``neuron_build/project``."""
