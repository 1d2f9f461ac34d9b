#!/usr/bin/env bash
# Installs the package with its test extra into .venv (idempotent) and runs the
# default test suite (fast: tiny configs; `-m slow` checks are separate).
# The tests run in one pytest-xdist worker per core, at most 4
# (KT_TEST_WORKERS overrides; 0 runs them in this process, e.g. for --pdb):
# most of a test's time is one core importing TensorFlow, tracing or
# waiting for a subprocess, so a 2-core machine runs the suite in ~2/3 of
# the time. `--dist loadscope` keeps a module's tests on one worker, so its
# module-scoped fixtures (a trained model, an export) are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
source scripts/venv_jax.sh
# Modules go to workers in collection order, which tests/conftest.py sorts
# longest first (xdist's default order, most tests first, left the longest
# one-test modules to the end).
python -m pytest -q -n "${KT_TEST_WORKERS:-auto}" --maxprocesses 4 --dist loadscope \
  --no-loadscope-reorder --durations 10 "$@"
