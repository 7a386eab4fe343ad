"""``python -m neuron_build.cli``: the ``neuron-build`` command."""

import sys

from neuron_build.cli import main

__all__: list[str] = []

sys.exit(main())
