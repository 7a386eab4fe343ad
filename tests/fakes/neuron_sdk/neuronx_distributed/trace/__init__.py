"""Tensor-parallel tracing (test double)."""

from neuronx_distributed.trace.trace import (  # noqa: F401
    TensorParallelNeuronModel,
    parallel_model_load,
    parallel_model_save,
    parallel_model_trace,
)
