"""Tests of ``neuron_build/compilers``."""
