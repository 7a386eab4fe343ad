"""Placeholder for neuronx-distributed.

This is not the real package. AWS publishes neuronx-distributed on its own package index; install it with
  pip install --extra-index-url https://pip.repos.neuron.amazonaws.com neuronx-distributed
(imitation of the PyPI placeholder, for neuron-build tests)
"""
