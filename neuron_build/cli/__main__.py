"""``python -m neuron_build.cli``: the ``neuron-build`` command."""

import sys

from neuron_build.cli import main

sys.exit(main())
