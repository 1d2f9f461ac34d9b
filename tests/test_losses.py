import math

import numpy as np
import pytest

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy


def hand_loss(logits, target, eps):
    v = logits.shape[-1]
    logp = logits - np.log(np.exp(logits).sum())
    q = np.full(v, eps / (v - 1))
    q[target] = 1 - eps
    return -(q * logp).sum() + (q * np.log(np.where(q > 0, q, 1))).sum()  # KL(q || p)


def test_loss_equals_hand_computation_and_ignores_padding():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    y = np.array([[1, 4, 0], [2, 0, 0]])  # pad id 0
    loss = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    per_token = [hand_loss(logits[0, 0], 1, 0.1), hand_loss(logits[0, 1], 4, 0.1),
                 hand_loss(logits[1, 0], 2, 0.1)]
    assert float(loss(y, logits)) == pytest.approx(np.mean(per_token), rel=1e-5)
    # Padding contributes nothing, whatever its logits are.
    changed = logits.copy()
    changed[0, 2] += 100.0
    changed[1, 1:] = -50.0
    assert float(loss(y, changed)) == pytest.approx(float(loss(y, logits)), rel=1e-6)
    values = np.asarray(loss.call(y, logits))
    assert values.shape == (2, 3) and np.all(values[y == 0] == 0)


def test_without_smoothing_it_is_cross_entropy():
    logits = np.array([[[2.0, 0.0, -1.0]]], "float32")
    loss = LabelSmoothedCrossEntropy(0.0, pad_id=2)
    expected = -math.log(math.exp(2) / (math.exp(2) + 1 + math.exp(-1)))
    assert float(loss(np.array([[0]]), logits)) == pytest.approx(expected, rel=1e-6)


def test_masked_accuracy_counts_real_tokens_only():
    logits = np.eye(4, dtype="float32")[[[1, 2, 3], [1, 0, 0]]]  # argmax = 1 2 3 / 1 0 0
    y = np.array([[1, 3, 3], [2, 0, 0]])
    metric = MaskedAccuracy(pad_id=0)
    metric.update_state(y, logits)
    assert float(metric.result()) == pytest.approx(2 / 4)


def test_accuracy_argmax_matches_keras_and_breaks_ties_to_the_lowest_index():
    from keras import ops

    from keras_transformer.metrics import argmax_last_axis

    rng = np.random.default_rng(0)
    logits = rng.integers(-2, 3, size=(4, 5, 9)).astype("float32")  # many ties
    expected = np.argmax(logits, axis=-1)  # NumPy: first maximum
    assert np.array_equal(np.asarray(argmax_last_axis(logits)), expected)
    assert np.array_equal(np.asarray(ops.argmax(logits, axis=-1)), expected)
    assert np.asarray(argmax_last_axis(logits)).dtype == np.int32


def test_on_tensorflow_the_accuracy_reads_the_logits_once():
    # Keras's ops.argmax rewrites -0.0 first: five more passes over the
    # logits in TensorFlow's executor (metrics.argmax_last_axis).
    import tensorflow as tf

    metric = MaskedAccuracy(pad_id=0)
    graph = tf.function(metric.update_state).get_concrete_function(
        tf.TensorSpec((2, 3), tf.int32), tf.TensorSpec((2, 3, 7), tf.float32)).graph
    [logits] = [op.outputs[0] for op in graph.get_operations()
                if op.type == "Placeholder" and op.outputs[0].shape.rank == 3]
    assert [op.type for op in logits.consumers()] == ["ArgMax"]


@pytest.mark.parametrize("eps", [0.1, 0.0])
def test_on_tensorflow_the_fused_loss_has_the_values_and_gradients_of_the_plain_one(eps):
    # kernels/cross_entropy.py: two XLA clusters and a written-out gradient
    # (softmax - q) instead of TensorFlow differentiating the keras.ops loss.
    import tensorflow as tf

    from keras_transformer import dispatch
    from keras_transformer.kernels import cross_entropy as fused_cross_entropy
    from keras_transformer.ops.label_smoothing import label_smoothed_cross_entropy

    loss = LabelSmoothedCrossEntropy(eps, pad_id=0)
    taken = []
    original = fused_cross_entropy.label_smoothed_cross_entropy
    fused_cross_entropy.label_smoothed_cross_entropy = (
        lambda *args: taken.append(1) or original(*args))
    try:
        loss.call(np.ones((1, 2), "int32"), tf.zeros((1, 2, 5)))
        with dispatch.configured(disabled={"fused_cross_entropy"}):
            loss.call(np.ones((1, 2), "int32"), tf.zeros((1, 2, 5)))
    finally:
        fused_cross_entropy.label_smoothed_cross_entropy = original
    assert taken == [1]  # on TensorFlow, unless switched off
    rng = np.random.default_rng(3)
    # Three shapes, so that the XLA functions are also traced with relaxed
    # (unknown) dimensions, the vocabulary included.
    for batch, length, vocab in [(4, 6, 50), (3, 5, 50), (2, 7, 33)]:
        y = rng.integers(1, vocab, (batch, length)).astype("int32")
        y[0, -2:] = 0
        logits = tf.constant(rng.normal(size=(batch, length, vocab)).astype("float32") * 3)
        upstream = tf.constant(rng.random((batch, length)).astype("float32"))
        results = []
        for fn in (loss.call, lambda a, b: label_smoothed_cross_entropy(a, b, eps, 0)):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                per_token = fn(y, logits)
            results.append((per_token.numpy(),
                            tape.gradient(per_token, logits, upstream).numpy()))
        (fused, fused_grad), (plain, plain_grad) = results
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fused_grad, plain_grad, rtol=1e-5, atol=1e-6)
        assert np.all(fused[0, -2:] == 0) and np.all(fused_grad[0, -2:] == 0)
        per_row = [hand_loss(logits.numpy()[1, t], y[1, t], eps) for t in range(length)]
        np.testing.assert_allclose(fused[1], per_row, rtol=1e-5, atol=1e-5)


def test_fused_loss_takes_bfloat16_logits_and_returns_their_gradient_dtype():
    import tensorflow as tf

    from keras_transformer.kernels import cross_entropy as fused_cross_entropy

    rng = np.random.default_rng(4)
    y = rng.integers(1, 40, (2, 3)).astype("int32")
    logits32 = tf.constant(rng.normal(size=(2, 3, 40)).astype("float32"))
    logits16 = tf.cast(logits32, tf.bfloat16)
    results = []
    for logits in (tf.cast(logits16, tf.float32), logits16):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            per_token = fused_cross_entropy.label_smoothed_cross_entropy(y, logits, 0.1, 0)
        grad = tape.gradient(per_token, logits)
        assert per_token.dtype == tf.float32 and grad.dtype == logits.dtype
        results.append((per_token.numpy(), tf.cast(grad, tf.float32).numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-2, atol=1e-3)
