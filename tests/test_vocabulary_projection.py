"""keras_transformer/vocabulary_projection.py: the tied projection in
training, in slices of the vocabulary where TensorFlow multiplies with
Eigen and the vocabulary is a multiple of 2,048."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import vocabulary_projection
from keras_transformer.layers.embedding import TokenEmbedding


@pytest.mark.parametrize("vocab,slice_size,expected", [
    (8192, 1024, [1024] * 8),
    (2048, 1024, [1024, 1024]),
    (32768, 1024, [1024] * 32),
    (10, 4, [4, 3, 3]),
    (3, 4, [3]),
])
def test_slice_sizes(vocab, slice_size, expected):
    assert vocabulary_projection.slice_sizes(vocab, slice_size) == expected


@pytest.mark.parametrize("vocab,slice_size", [(10, 4), (12, 4), (7, 16)])
def test_values_and_gradients_equal_one_matmul(vocab, slice_size):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(6, 5)).astype("float32"))
    table = tf.constant(rng.normal(size=(vocab, 5)).astype("float32"))
    upstream = tf.constant(rng.normal(size=(6, vocab)).astype("float32"))
    results = []
    for project in (lambda x, t: vocabulary_projection.logits(x, t, slice_size),
                    lambda x, t: tf.matmul(x, t, transpose_b=True)):
        with tf.GradientTape() as tape:
            tape.watch([x, table])
            logits = project(x, table)
            loss = tf.reduce_sum(logits * upstream)
        results.append([logits.numpy()] + [g.numpy() for g in tape.gradient(loss, [x, table])])
    for ours, reference in zip(*results):
        assert ours.shape == reference.shape
        np.testing.assert_allclose(ours, reference, rtol=1e-6, atol=1e-6)


def test_used_only_for_multiples_of_2048_without_onednn(monkeypatch):
    monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: False)
    assert [v for v in (2048, 3000, 4096, 8000, 8192, 32000, 32768, 37000)
            if vocabulary_projection.pays(v)] == [2048, 4096, 8192, 32768]
    monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: True)
    assert not vocabulary_projection.pays(8192)


@pytest.mark.parametrize("setting,expected", [("0", "False"), ("1", "True")])
def test_reads_tensorflows_onednn_setting(setting, expected):
    # The private query must follow TF_ENABLE_ONEDNN_OPTS; if a TensorFlow
    # release moves or changes it, this fails instead of silently choosing.
    code = ("from keras_transformer import vocabulary_projection as v; "
            "print(v.tensorflow_uses_onednn())")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.strip().splitlines()[-1] == expected


def _logits_and_gradients(embedding, x, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = embedding.logits(x, training=training)
        loss = tf.reduce_sum(logits * tf.cos(tf.range(embedding.vocab_size, dtype="float32")))
    gradients = tape.gradient(loss, [x, embedding.embeddings.value])
    return [logits.numpy()] + [g.numpy() for g in gradients]


def test_token_embedding_trains_in_slices_where_it_pays(monkeypatch):
    embedding = TokenEmbedding(2048, 8)
    embedding.build()
    x = tf.constant(np.random.default_rng(1).normal(size=(2, 3, 8)).astype("float32"))
    calls = []
    original = vocabulary_projection.logits
    monkeypatch.setattr(vocabulary_projection, "logits",
                        lambda *args: calls.append(args[1].shape) or original(*args))

    monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: True)
    whole = _logits_and_gradients(embedding, x, training=True)
    assert calls == []
    monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: False)
    sliced = _logits_and_gradients(embedding, x, training=True)
    assert calls == [(2048, 8)]
    assert sliced[0].shape == (2, 3, 2048) and sliced[0].dtype == np.float32
    for a, b in zip(sliced, whole):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)

    # Not outside training (decoding has its own form), nor for a
    # vocabulary Eigen is not slow for.
    embedding.logits(x, training=False)
    odd = TokenEmbedding(2000, 8)
    odd.build()
    odd.logits(x, training=True)
    assert calls == [(2048, 8)]


def test_not_under_mixed_precision(monkeypatch):
    monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: False)
    calls = []
    monkeypatch.setattr(vocabulary_projection, "logits", lambda *args: calls.append(1))
    embedding = TokenEmbedding(2048, 8, dtype="mixed_bfloat16")
    embedding.build()
    logits = embedding.logits(tf.zeros((2, 3, 8), "bfloat16"), training=True)
    assert calls == [] and logits.dtype == tf.float32
    assert keras.backend.standardize_dtype(embedding.embeddings.dtype) == "float32"


def test_model_trains_the_same_in_slices(monkeypatch):
    import keras_transformer as kt

    config = kt.get_config("tiny", vocab_size=2048, dropout=0.0)
    rng = np.random.default_rng(2)
    source = rng.integers(4, 2048, (4, 7)).astype("int32")
    target = rng.integers(4, 2048, (4, 6)).astype("int32")
    runs = {}
    calls = []
    original = vocabulary_projection.logits
    monkeypatch.setattr(vocabulary_projection, "logits",
                        lambda *args: calls.append(1) or original(*args))
    for eigen in (False, True):
        monkeypatch.setattr(vocabulary_projection, "tensorflow_uses_onednn", lambda: not eigen)
        keras.utils.set_random_seed(0)
        model = kt.Transformer(config)
        model.compile(optimizer=kt.transformer_adam(config.d_model),
                      loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing,
                                                        pad_id=config.pad_id))
        losses = [float(model.train_on_batch((source, target[:, :-1]), target[:, 1:]))
                  for _ in range(3)]
        runs[eigen] = losses, [w.numpy() for w in model.weights]
        assert bool(calls) == eigen  # traced once, in the Eigen run only
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-6)
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
