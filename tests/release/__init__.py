"""Tests of ``neuron_build/release``."""
