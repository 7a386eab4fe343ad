"""Placeholder for neuronx-cc.

This is not the real package. AWS publishes neuronx-cc on its own package index; install it with
  pip install --extra-index-url https://pip.repos.neuron.amazonaws.com neuronx-cc
(imitation of the PyPI placeholder, for neuron-build tests)
"""
