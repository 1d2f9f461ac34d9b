"""The Quick start's main job (training/demo.py).

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


def run_demo(tmp_path, *extra, timeout):
    command = [sys.executable, os.path.join(ROOT, "training", "demo.py"),
               "--run-dir", str(tmp_path / "run"), "--saved-models", str(tmp_path / "sm"),
               *extra]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
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


# The run is deterministic on one machine (89.4 on the project's CPU), but
# another CPU's rounding picks another of the chaotic trajectories that seeds
# 1-3 sample: 89.4-93.3 in float32, 89.2-90.8 in mixed bfloat16 (86.9-92.8
# and 88.8-90.3 before the loss's written-out gradient; README). The bound
# sits below that spread and far above the 19.0 of the no-positions control,
# so it fails on a broken model, not on a different machine.
DEMO_MIN_BLEU = 85.0


@pytest.mark.slow
def test_demo_reaches_high_bleu(tmp_path):
    _, bleu, _ = run_demo(tmp_path, timeout=3600)
    assert bleu >= DEMO_MIN_BLEU


@pytest.mark.slow
def test_without_positions_the_demo_stays_far_below(tmp_path):
    _, bleu, _ = run_demo(tmp_path, "--position-encoding", "none", timeout=3600)
    assert bleu < 50.0
