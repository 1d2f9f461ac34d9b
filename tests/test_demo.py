"""The Quick start's main job (kt-demo, keras_transformer/cli/demo.py).

The default run checks that every step works and every artifact appears,
with a tiny model and a few steps. The `slow` tests run the real demo and
check its quality claims: high BLEU on the built-in test split, and far
below without positional encoding."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The console script, installed beside this Python (scripts/venv.sh).
KT_DEMO = os.path.join(os.path.dirname(sys.executable), "kt-demo")
# TensorFlow's start-up lines that kt-demo hides unless asked (--tf-verbose).
START_UP_NOISE = ("failed call to cuInit", "Could not find cuda drivers",
                  "oneDNN custom operations are on", "oneDNN supports DT_INT64",
                  "absl::InitializeLog()", "cpu_feature_guard")


def run_demo(tmp_path, *extra, timeout):
    command = [KT_DEMO, "--run-dir", str(tmp_path / "run"), "--saved-models", str(tmp_path / "sm"),
               *extra]
    # As a user's shell runs it: no log level set (the tests' conftest sets one).
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "KT_VERBOSE")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for noise in START_UP_NOISE:
        assert noise not in result.stderr, result.stderr[-3000:]
    bleu = float(re.search(r"test BLEU\s+([\d.]+)", result.stdout).group(1))
    return result.stdout, bleu, result.stderr


def test_demo_runs_end_to_end(tmp_path):
    out, bleu, err = run_demo(tmp_path, "--config", "tiny", "--train-steps", "12",
                              "--test-sentences", "8", "--average", "2", timeout=900)
    assert 0.0 <= bleu <= 100.0
    assert "BLEU|nrefs:1" in out and "chrF2|" in out  # sacreBLEU signatures
    assert os.path.isfile(tmp_path / "sm" / "demo" / "1" / "saved_model.pb")
    pictures = sorted(os.listdir(tmp_path / "run" / "pictures"))
    assert "attention_decoder_cross.png" in pictures and "positional_encoding.png" in pictures
    assert os.listdir(tmp_path / "run" / "averaged")
    # False alarms a user would read as failures: Keras's on `fit` with an
    # already shuffled dataset, at the end of the first validation pass and
    # on a softmax over one key (a one-token translation's attention map),
    # TensorFlow's on loading a SavedModel that lacks custom gradients.
    for alarm in ("`shuffle=True` was passed", "Your input ran out of data",
                  "unsaved custom gradients", "Did you mean to use a sigmoid"):
        assert alarm not in err and alarm not in out


# The run is deterministic on one machine, but another CPU's rounding picks
# another of the trajectories that different seeds sample. The bound sits
# below the measured spread over seeds, precisions and CPUs and far above the
# no-positions control (docs/data.md, docs/performance.md), so it fails on a
# broken model, not on a different machine.
DEMO_MIN_BLEU = 85.0


@pytest.mark.slow
def test_demo_reaches_high_bleu(tmp_path):
    _, bleu, _ = run_demo(tmp_path, timeout=3600)
    assert bleu >= DEMO_MIN_BLEU


@pytest.mark.slow
def test_without_positions_the_demo_stays_far_below(tmp_path):
    _, bleu, _ = run_demo(tmp_path, "--position-encoding", "none", timeout=3600)
    assert bleu < 50.0
