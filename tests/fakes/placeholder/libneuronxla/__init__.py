"""Placeholder for libneuronxla.

This is not the real package. AWS publishes libneuronxla on its own package index; install it with
  pip install --extra-index-url https://pip.repos.neuron.amazonaws.com libneuronxla
(imitation of the PyPI placeholder, for neuron-build tests)
"""
