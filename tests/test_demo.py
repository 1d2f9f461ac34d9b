"""The Quick start's main job (kt-demo, keras_transformer/cli/demo.py).

The default run checks that every step works and every artifact appears,
with a tiny model and a few steps. The `slow` tests run the real demo and
check its quality claims: high BLEU on the built-in test split, and far
below without positional encoding."""

import os
import re
import sys

import pytest
import sacrebleu

from support.demo_run import run_demo as run_kt_demo
from support.demo_run import tiny_demo

# TensorFlow's start-up lines that kt-demo hides unless asked (--tf-verbose).
START_UP_NOISE = ("failed call to cuInit", "Could not find cuda drivers",
                  "oneDNN custom operations are on", "oneDNN supports DT_INT64",
                  "absl::InitializeLog()", "cpu_feature_guard")


def check_run(returncode, stdout, stderr):
    """The run succeeded quietly; returns its test BLEU."""
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    for noise in START_UP_NOISE:
        assert noise not in stderr, stderr[-3000:]
    return float(re.search(r"test BLEU\s+([\d.]+)", stdout).group(1))


def run_demo(tmp_path, *extra, timeout):
    done = run_kt_demo(str(tmp_path), *extra, timeout=timeout)
    return done.stdout, check_run(done.returncode, done.stdout, done.stderr), done.stderr


@pytest.mark.e2e
def test_demo_runs_end_to_end(tmp_path_factory):
    # The tiny run tests/test_playground.py serves too (run once per pytest run).
    demo = tiny_demo(tmp_path_factory)
    out, err = demo["stdout"], demo["stderr"]
    bleu = check_run(demo["returncode"], out, err)
    saved_models, run_dir = demo["saved_models"], demo["run_dir"]
    assert "chrF2|" in out  # sacreBLEU signatures
    from keras_transformer.data.synthetic import builtin_source
    from keras_transformer.export import read_examples

    test = list(builtin_source("", "test", "en", "synth").take(8).as_numpy_iterator())
    held_out = [s.decode() for s, _ in test]
    # A dozen updates teach the tiny model nothing (BLEU 0.0), so the
    # README's scores are test_demo_reaches_high_bleu's to check; here the
    # summary's test BLEU is, as the README shows it, sacreBLEU's score of
    # the 8 held-out sentences against their references, to its 0.1 rounding.
    scored = re.search(r"^BLEU\|nrefs:1\|\S* = ([\d.]+) .* ref_len = (\d+)\)$", out, re.M)
    assert scored, out[-3000:]
    references = [t.decode() for _, t in test]
    assert int(scored.group(2)) == sacrebleu.corpus_bleu(references, [references]).ref_len
    assert abs(bleu - float(scored.group(1))) <= 0.05 + 1e-9, (bleu, scored.group(0))
    assert "test BLEU" in out and "(sacreBLEU, 8 held-out sentences)" in out
    assert os.path.isfile(os.path.join(saved_models, "demo", "1", "saved_model.pb"))
    # The export carries held-out sentences for the playground to offer.
    assert read_examples(os.path.join(saved_models, "demo", "1")) == held_out
    pictures = sorted(os.listdir(os.path.join(run_dir, "pictures")))
    assert "attention_decoder_cross.png" in pictures and "positional_encoding.png" in pictures
    assert os.listdir(os.path.join(run_dir, "averaged"))
    # False alarms a user would read as failures: Keras's on `fit` with an
    # already shuffled dataset, at the end of the first validation pass and
    # on a softmax over one key (a one-token translation's attention map),
    # TensorFlow's on loading a SavedModel that lacks custom gradients.
    for alarm in ("`shuffle=True` was passed", "Your input ran out of data",
                  "unsaved custom gradients", "Did you mean to use a sigmoid"):
        assert alarm not in err and alarm not in out


def test_without_matplotlib_the_pictures_phase_is_one_line(tmp_path, monkeypatch, capsys):
    # A plain `pip install .` lacks matplotlib (the `viz` extra): the last
    # phase says so and how to draw the pictures later, and reads nothing
    # (this run directory does not exist), so the demo still ends well.
    from keras_transformer.cli.demo import draw_pictures

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    run_dir = str(tmp_path / "run")
    assert draw_pictures(run_dir, "the dog sees a cat", "averaged/ckpt-12") is None
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    for part in ("matplotlib is not installed", "pip install 'attention-transformer-keras[viz]'",
                 f"kt-visualize --run-dir {run_dir} --sentence 'the dog sees a cat'"):
        assert part in lines[0], (part, lines[0])
    assert not os.path.exists(run_dir)


# The run is deterministic on one machine, but another CPU's rounding picks
# another of the trajectories that different seeds sample. The bound sits
# below the measured spread over seeds, precisions and CPUs and far above the
# no-positions control (docs/data.md, docs/performance.md), so it fails on a
# broken model, not on a different machine.
DEMO_MIN_BLEU = 85.0


@pytest.mark.slow
def test_demo_reaches_high_bleu(tmp_path):
    _, bleu, _ = run_demo(tmp_path, timeout=3600)
    assert bleu >= DEMO_MIN_BLEU, (
        f"test BLEU {bleu} < {DEMO_MIN_BLEU}: the README's demo scores 92.02 (AVX-512 with "
        f"BF16), 88.36 (AVX-512 without) and 95.23 (AVX2), seeds 92.02-95.52 "
        f"(docs/experiments.md); the floor is 3 below the lowest, far above the "
        f"no-positions control's 19.0 (docs/data.md)")


@pytest.mark.slow
def test_without_positions_the_demo_stays_far_below(tmp_path):
    _, bleu, _ = run_demo(tmp_path, "--position-encoding", "none", timeout=3600)
    assert bleu < 50.0
