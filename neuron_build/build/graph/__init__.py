"""The graph key: reuse of a stored graph's compiled files (reuse), its compile lock (gate), the probe of a
model build's graphs (probe), external weights relinked (relink), and the check against a fresh capture (fresh)."""

__all__: list[str] = []
