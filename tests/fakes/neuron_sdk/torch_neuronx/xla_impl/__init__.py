"""Test double of ``torch_neuronx.xla_impl`` (see tests/fakes/README.md, "The split XLA path")."""
