"""neuron-build: a compile-artifact build system for AWS Neuron.

A declarative matrix (``buckets.toml``: models x shape buckets x dtypes x compiler profiles) becomes a
doit task graph in which each (model, bucket, dtype, profile, backend, hardware target) tuple is a
cached build target keyed by a content hash.

Importing this package never imports torch: compiles run in ``python -m neuron_build.worker``.
"""

__version__ = "0.1.0"


__all__ = ["__version__"]
