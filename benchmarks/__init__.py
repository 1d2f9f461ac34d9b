"""Benchmarks (not part of the library): throughput against TF Model Garden."""
