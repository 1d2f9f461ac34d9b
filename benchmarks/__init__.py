"""Benchmarks and profilers (not part of the library): `python -m benchmarks
<subcommand> [flags]` from the repository root; `python -m benchmarks --help`
lists the subcommands. Nothing here imports TensorFlow (the `jax` subcommand
runs where it is absent)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subcommand(name, *args):
    """`(command, env)` that run `python -m benchmarks <name> <args>` in a
    fresh process with this interpreter, from any working directory (the
    repository root leads PYTHONPATH, so `benchmarks` and, without an
    install, the library are found)."""
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}
    return [sys.executable, "-m", "benchmarks", name, *args], env
