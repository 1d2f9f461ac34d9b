#!/usr/bin/env bash
# Installs the package with its test extra into .venv (idempotent) and runs the
# default test suite (fast: tiny configs; `-m slow` checks are separate).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
source scripts/venv_jax.sh
python -m pytest -q "$@"
