from neuron_build.tasks import *  # noqa: F401,F403  (the build: see neuron_build/tasks.py)
