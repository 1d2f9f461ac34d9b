"""Benchmarks and profilers (not part of the library): `python -m benchmarks
<subcommand> [flags]` from the repository root; `python -m benchmarks --help`
lists the subcommands. Nothing here imports TensorFlow (the `jax` subcommand
runs where it is absent)."""
