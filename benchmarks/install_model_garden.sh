#!/usr/bin/env bash
# Installs TF Model Garden (the benchmark's reference) into .venv without
# letting it downgrade TensorFlow: tf-models-official 2.20 pins TF 2.20, but its
# Seq2SeqTransformer runs on TF 2.21 with tf-keras 2.21.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
python -m pip install --quiet --no-deps tf-models-official==2.20.0
python -m pip install --quiet tf-keras==2.21.0 gin-config pyyaml scipy tensorflow-hub
