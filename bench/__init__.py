"""Benchmarks: `python -m bench.<name>`; see bench/README.md."""
