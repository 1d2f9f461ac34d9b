import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers.dropout import Dropout, dropout, keep_threshold

# Elements per statistical check: the kept fraction's standard deviation is
# sqrt(0.09 / N) ~ 2.1e-4, so the 5-sigma bounds below are ~1e-3.
N = 2**21


def _sigma(rate, n=N):
    return np.sqrt(rate * (1 - rate) / n)


def test_threshold_and_effective_rate():
    assert keep_threshold(0.1) == 6554
    assert keep_threshold(0.0) == 0
    assert abs(keep_threshold(0.1) / 65536 - 0.1) < 1e-5
    assert abs(keep_threshold(0.3) / 65536 - 0.3) < 1e-5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_keeps_the_right_fraction_and_preserves_the_mean(dtype):
    # Normal inputs, so per-element rounding in bfloat16 averages out: what
    # is left is any systematic bias of the keep decision or the scale.
    rng = np.random.default_rng(0)
    x = tf.cast(tf.constant(rng.normal(1.0, 0.5, (N // 256, 256)).astype("float32")), dtype)
    y = dropout(x, 0.1, keras.random.SeedGenerator(1))
    assert y.dtype == x.dtype and y.shape == x.shape
    x32, y32 = (np.asarray(tf.cast(t, tf.float32)) for t in (x, y))
    kept = y32 != 0
    rate = keep_threshold(0.1) / 65536
    assert abs((1 - kept.mean()) - rate) < 5 * _sigma(rate)
    scale = 65536 / (65536 - keep_threshold(0.1))
    tolerance = 1e-6 if dtype == "float32" else 2**-8  # one rounding of the product
    np.testing.assert_allclose(y32[kept], x32[kept] * scale, rtol=tolerance)
    # E[y] = x: the ratio of sums is 1 within 5 sigma of sampling noise.
    assert abs(y32.sum() / x32.sum() - 1) < 5 * np.sqrt(1.25 * (rate / (1 - rate)) / N)


def test_keras_bfloat16_dropout_is_biased_and_ours_is_not():
    # Why this module exists besides speed: Keras's TF dropout draws its
    # uniforms in the input dtype. In bfloat16 those are multiples of 1/128,
    # so it keeps 115/128 = 0.8984 instead of 0.9, and scales by 1/0.9
    # rounded to bfloat16 (1.109375): E[y] = 0.9967 x, ~13 sigma here. Ours
    # keeps 0.9 and scales in float32.
    rng = np.random.default_rng(5)
    x = tf.cast(tf.constant(rng.normal(1.0, 0.5, (N // 256, 256)).astype("float32")),
                tf.bfloat16)
    x_sum = float(tf.reduce_sum(tf.cast(x, tf.float32)))
    ours = float(tf.reduce_sum(tf.cast(dropout(x, 0.1, keras.random.SeedGenerator(2)),
                                       tf.float32))) / x_sum
    theirs = float(tf.reduce_sum(tf.cast(keras.random.dropout(x, 0.1, seed=2),
                                         tf.float32))) / x_sum
    sigma = np.sqrt(1.25 * (0.1 / 0.9) / N)  # of the ratio, for these inputs
    assert abs(theirs - 115 / 128 * 1.109375) < 5 * sigma
    assert abs(theirs - 1) > 8 * sigma
    assert abs(ours - 1) < 5 * sigma


def test_identity_when_not_training_or_rate_zero():
    x = tf.random.normal((4, 8))
    layer = Dropout(0.5)
    np.testing.assert_array_equal(layer(x, training=False), x)
    np.testing.assert_array_equal(layer(x), x)
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)


def test_masks_differ_between_calls_and_repeat_with_a_seed():
    x = tf.ones((64, 64))
    layer = Dropout(0.5, seed=3)
    first, second = (np.asarray(layer(x, training=True)) != 0 for _ in range(2))
    assert (first != second).mean() > 0.3
    again = np.asarray(Dropout(0.5, seed=3)(x, training=True)) != 0
    np.testing.assert_array_equal(first, again)


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 4, 9, 9), (7,), (1, 1)])
def test_odd_last_axes_and_dynamic_shapes(shape):
    # Odd last axes (attention weights over k_len) take the flat path; in a
    # graph with unknown dimensions too.
    layer = Dropout(0.25, seed=0)

    @tf.function(input_signature=[tf.TensorSpec([None] * len(shape), tf.float32)])
    def run(x):
        return layer(x, training=True)

    for call in (lambda x: layer(x, training=True), run):
        y = np.asarray(call(tf.ones(shape)))
        assert y.shape == shape
        assert set(np.unique(y)) <= {0.0, np.float32(65536 / (65536 - keep_threshold(0.25)))}


def test_gradient_is_the_mask_times_the_scale():
    x = tf.random.normal((16, 32))
    layer = Dropout(0.2, seed=4)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    grad = tape.gradient(y, x).numpy()
    scale = 65536 / (65536 - keep_threshold(0.2))
    np.testing.assert_allclose(grad, (y.numpy() != 0) * scale, rtol=1e-6)


def test_validation_and_config():
    with pytest.raises(ValueError, match="rate"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="rate"):
        Dropout(-0.1)
    clone = Dropout.from_config(Dropout(0.3, seed=7).get_config())
    assert (clone.rate, clone.seed) == (0.3, 7)
