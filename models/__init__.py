"""Example models of the shipped matrix (``buckets.toml``)."""
