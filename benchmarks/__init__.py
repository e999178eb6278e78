"""Benchmarks and the emulated cluster, run as modules from the repository root, e.g.
``python -m benchmarks.compare.bytes_per_tier``, ``sudo python -m benchmarks.compare``."""
