"""Placeholder for torch-neuronx.

This is not the real package. AWS publishes torch-neuronx on its own package index; install it with
  pip install --extra-index-url https://pip.repos.neuron.amazonaws.com torch-neuronx
(imitation of the PyPI placeholder, for neuron-build tests)
"""
