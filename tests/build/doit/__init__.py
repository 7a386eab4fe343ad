"""Tests of ``neuron_build/build/doit``."""
