"""Compiler backends. Each runs inside the worker subprocess; see :mod:`neuron_build.compilers.base`."""


__all__: list[str] = []
