"""Tests of ``neuron_build/build/fleet``."""
