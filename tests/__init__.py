"""neuron-build's test suite: ``tests/<package>/test_<module>.py`` for a test about one module of
``neuron_build/<package>/``, ``tests/flows/`` for feature trials through the CLI, ``tests/helpers/`` for what
they share, ``tests/fakes/`` for the Neuron toolchain's test double."""
