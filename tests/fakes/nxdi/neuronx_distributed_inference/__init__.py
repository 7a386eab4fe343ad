"""Test double of NeuronX Distributed Inference (NxDI): the API neuron-build calls, the files compile()
writes and the compiler it runs (the neuronx-cc double on PATH). See tests/fakes/README.md, "NxDI"."""

__version__ = "0.7.4217"
