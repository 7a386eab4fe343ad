"""Small shared computations of neuron_build.util."""

from __future__ import annotations

from neuron_build.util import percentile


def test_percentile_nearest_rank():
    assert percentile([3.0, 1.0, 2.0], 95, method="nearest-rank") == 3.0
    assert percentile(range(1, 101), 95, method="nearest-rank") == 95
    assert percentile(range(1, 21), 95, method="nearest-rank") == 19
    assert percentile([5.0], 50) == 5.0

