"""Benchmarks for gemkernels (run from the repository root: ``python -m bench.select_floor``)."""
