"""keras_transformer/kernels/vocabulary_projection.py: the tied projection in
training, in slices of the vocabulary where TensorFlow multiplies with
Eigen and the vocabulary is a multiple of 2,048. The decision itself, the
slice sizes and a model trained through the slices: `test_eigen_slices.py`."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from support.float32 import assert_matmul_close

from keras_transformer.kernels import vocabulary_projection
from keras_transformer.layers.embedding import TokenEmbedding
from support.common import force_matmul_kernels

# Compares float results of two computation paths (docs/testing.md#numerics).
pytestmark = pytest.mark.numerics


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
    (logits, dx, dtable), (logits_ref, dx_ref, dtable_ref) = results
    # The products each result is, whatever order the kernels sum in.
    assert_matmul_close(logits, logits_ref, x.numpy(), table.numpy().T)
    assert_matmul_close(dx, dx_ref, upstream.numpy(), table.numpy())
    assert_matmul_close(dtable, dtable_ref, upstream.numpy().T, x.numpy())


def _upstream(vocab_size):
    """The logits' gradient that `_logits_and_gradients`'s loss gives."""
    return tf.cos(tf.range(vocab_size, dtype="float32"))


def _logits_and_gradients(embedding, x, training):
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = embedding.logits(x, training=training)
        loss = tf.reduce_sum(logits * _upstream(embedding.vocab_size))
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

    force_matmul_kernels(monkeypatch, "onednn")
    whole = _logits_and_gradients(embedding, x, training=True)
    assert calls == []
    force_matmul_kernels(monkeypatch, "eigen")
    sliced = _logits_and_gradients(embedding, x, training=True)
    assert calls == [(2048, 8)]
    assert sliced[0].shape == (2, 3, 2048) and sliced[0].dtype == np.float32
    # Equal up to the order the kernels sum in (oneDNN and Eigen differ).
    rows = x.numpy().reshape(-1, 8)
    table = embedding.embeddings.numpy()
    upstream = np.broadcast_to(_upstream(2048).numpy(), (rows.shape[0], 2048))
    assert_matmul_close(sliced[0].reshape(-1, 2048), whole[0].reshape(-1, 2048), rows, table.T)
    assert_matmul_close(sliced[1].reshape(-1, 8), whole[1].reshape(-1, 8), upstream, table)
    assert_matmul_close(sliced[2], whole[2], upstream.T, rows)

    # Not outside training (decoding has its own form), nor for a
    # vocabulary Eigen is not slow for.
    embedding.logits(x, training=False)
    odd = TokenEmbedding(2000, 8)
    odd.build()
    odd.logits(x, training=True)
    assert calls == [(2048, 8)]


def test_not_under_mixed_precision(monkeypatch):
    force_matmul_kernels(monkeypatch, "eigen")
    calls = []
    monkeypatch.setattr(vocabulary_projection, "logits", lambda *args: calls.append(1))
    embedding = TokenEmbedding(2048, 8, dtype="mixed_bfloat16")
    embedding.build()
    logits = embedding.logits(tf.zeros((2, 3, 8), "bfloat16"), training=True)
    assert calls == [] and logits.dtype == tf.float32
    assert keras.backend.standardize_dtype(embedding.embeddings.dtype) == "float32"

