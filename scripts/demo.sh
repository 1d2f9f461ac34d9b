#!/usr/bin/env bash
# The Quick start's main job: installs the package into .venv (idempotent),
# then runs kt-demo: trains on the built-in corpus, evaluates BLEU with beam
# search, exports a SavedModel to saved_models/demo/<version>/, translates
# held-out sentences and draws attention maps. A few minutes on 2 CPU cores,
# plus the first install; docs/performance.md has measured times. Arguments
# go to kt-demo (kt-demo --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
kt-demo "$@"
