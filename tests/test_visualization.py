import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_directory import RunDirectory
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
from keras_transformer.visualization import plot_attention

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
