import os
import subprocess
import sys

import numpy as np
import pytest

from support.processes import ENV
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from keras_transformer.visualization import INSTALL_VIZ, MatplotlibMissing, plot_attention

CORPUS = ["the dog sees a cat", "lus hund sieht kat", "a big bird flies", "trit vogel fliegt"] * 30


def test_plot_attention_checks_labels(tmp_path):
    weights = [np.full((2, 3, 4), 0.25)]
    path = plot_attention(weights, list("abc"), list("wxyz"), "t", str(tmp_path / "a.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="labels"):
        plot_attention(weights, list("ab"), list("wxyz"), "t", str(tmp_path / "b.png"))


def test_visualize_cli_writes_every_picture(tmp_path):
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, max_length=64)
    model = kt.Transformer(config)
    model.build()
    run = RunDirectory(str(tmp_path / "run"))
    run.save_config(config)
    run.save_tokenizer(tokenizer)
    tf.train.Checkpoint(model=model).save(os.path.join(run.checkpoint_dir, "ckpt"))
    out = tmp_path / "pictures"
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.visualize", "--run-dir", run.path,
         "--sentence", "the dog sees a cat", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = sorted(os.listdir(out))
    assert names == ["attention_decoder_cross.png", "attention_decoder_self.png",
                     "attention_encoder_self.png", "positional_encoding.png"]
    assert "translation:" in result.stdout


# A plain `pip install .` lacks matplotlib (the `viz` extra). These tests make
# `import matplotlib` fail as it does there: a None in sys.modules.
HIDE_MATPLOTLIB = "import sys\nsys.modules['matplotlib'] = None\n"


def test_without_matplotlib_plotting_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MatplotlibMissing, match=r"matplotlib is not installed.*\[viz\]"):
        plot_attention([np.full((1, 2, 2), 0.5)], list("ab"), list("cd"), "t",
                       str(tmp_path / "a.png"))
    assert not os.path.exists(tmp_path / "a.png")


def test_kt_visualize_without_matplotlib_is_one_error_line(tmp_path):
    # The check comes before the run is read: this run directory does not
    # exist, and the error is still about matplotlib.
    (tmp_path / "sitecustomize.py").write_text(HIDE_MATPLOTLIB)
    env = {**ENV, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path)] + [p for p in [ENV.get("PYTHONPATH")] if p])}
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.visualize", "--run-dir",
         str(tmp_path / "no-run"), "--sentence", "the dog sees a cat"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: matplotlib is not installed; the pictures need it, from the "
                      f"viz extra: {INSTALL_VIZ}"], result.stderr[-2000:]
    assert result.stdout == ""
