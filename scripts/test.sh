#!/usr/bin/env bash
# Installs the package with its test extra into .venv (idempotent) and runs the
# default test suite (fast: tiny configs). The end-to-end tier (`-m e2e`,
# docs/testing.md#tiers) and the `-m slow` checks are separate; .ci/run runs
# the default suite and the e2e tier.
# The tests run in one pytest-xdist worker per core, at most 4
# (KT_TEST_WORKERS overrides; 0 runs them in this process, e.g. for --pdb):
# most of a test's time is one core importing TensorFlow, tracing or
# waiting for a subprocess. `--dist loadfile` keeps a file's tests on one
# worker, so its module-scoped fixtures (a trained model, an export) are
# built once; files go to workers in collection order
# (`--no-loadscope-reorder`): xdist's default, most tests first, hands the
# long one-test files (the demo, the recipe) out last, while the other
# worker idles. `-rs` lists every skipped test with its reason (the optional
# tool it needs, e.g. Chromium for the playground test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
# The end-to-end tier (`-m e2e`, docs/testing.md#tiers) also runs the model
# in a JAX environment and the corpus pipeline in an Apache Beam one.
case " $* " in
  *e2e*) source scripts/venv_jax.sh; source scripts/venv_beam.sh ;;
esac
python -m pytest -q -rs -n "${KT_TEST_WORKERS:-auto}" --maxprocesses 4 --dist loadfile \
  --no-loadscope-reorder --durations 10 "$@"
