import math

import numpy as np
import pytest

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy


def hand_loss(logits, target, eps):
    v = logits.shape[-1]
    logp = logits - np.log(np.exp(logits).sum())
    q = np.full(v, eps / (v - 1))
    q[target] = 1 - eps
    return -(q * logp).sum() + (q * np.log(q)).sum()  # KL(q || p)


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


def test_on_tensorflow_the_loss_is_its_own_xla_cluster_with_the_same_values():
    # XLA fuses the loss's passes over the logits (keras_transformer/xla.py);
    # values and gradients are those of the plain keras.ops function.
    import tensorflow as tf

    from keras_transformer.losses import label_smoothed_cross_entropy

    loss = LabelSmoothedCrossEntropy(0.1, pad_id=0)
    assert loss._per_token_loss.function_spec.jit_compile is True
    rng = np.random.default_rng(3)
    y = rng.integers(0, 50, (4, 6)).astype("int32")
    y[0, -2:] = 0
    logits = tf.constant(rng.normal(size=(4, 6, 50)).astype("float32") * 3)
    results = []
    for fn in (loss.call, lambda a, b: label_smoothed_cross_entropy(a, b, 0.1, 0)):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            per_token = fn(y, logits)
        results.append((per_token.numpy(), tape.gradient(per_token, logits).numpy()))
    for compiled, plain in zip(*results):
        np.testing.assert_allclose(compiled, plain, rtol=1e-5, atol=1e-6)
    assert np.all(results[0][0][0, -2:] == 0)
