"""Side-by-side relay benchmark: direct vs nginx vs the sidecar (``python -m bench.run``)."""
