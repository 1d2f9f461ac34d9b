"""keras_transformer/vocabulary_projection.py: the tied projection in
training, in slices of the vocabulary where TensorFlow multiplies with
Eigen and the vocabulary is a multiple of 2,048. The decision itself, the
slice sizes and a model trained through the slices: `test_eigen_slices.py`."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import tensorflow_kernels, vocabulary_projection
from keras_transformer.layers.embedding import TokenEmbedding


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

    monkeypatch.setattr(tensorflow_kernels, "multiplies_with_eigen", lambda: False)
    whole = _logits_and_gradients(embedding, x, training=True)
    assert calls == []
    monkeypatch.setattr(tensorflow_kernels, "multiplies_with_eigen", lambda: True)
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
    monkeypatch.setattr(tensorflow_kernels, "multiplies_with_eigen", lambda: True)
    calls = []
    monkeypatch.setattr(vocabulary_projection, "logits", lambda *args: calls.append(1))
    embedding = TokenEmbedding(2048, 8, dtype="mixed_bfloat16")
    embedding.build()
    logits = embedding.logits(tf.zeros((2, 3, 8), "bfloat16"), training=True)
    assert calls == [] and logits.dtype == tf.float32
    assert keras.backend.standardize_dtype(embedding.embeddings.dtype) == "float32"

