from neuron_build.tasks import *  # the build: see neuron_build/tasks.py
