import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import dispatch
from keras_transformer.kernels import dropout as philox_dropout
from keras_transformer.layers.dropout import Dropout
from keras_transformer.ops.dropout import keep_scale, keep_threshold


def dropout(x, rate, seed, residual=None, portable=False):
    """`dispatch.dropout`: on TensorFlow the Philox kernel, or with
    `portable` the `keras.ops` form (`ops/dropout.py`), which other
    backends always take."""
    with dispatch.configured(fast_paths="off" if portable else "auto"):
        return dispatch.dropout(x, rate, seed, residual)

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


@pytest.mark.parametrize("portable", [False, True], ids=["philox_xla", "keras_random"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_keeps_the_right_fraction_and_preserves_the_mean(dtype, portable):
    # Normal inputs, so per-element rounding in bfloat16 averages out: what
    # is left is any systematic bias of the keep decision or the scale. Both
    # implementations: on TensorFlow the default is the fused Philox one.
    rng = np.random.default_rng(0)
    x = tf.cast(tf.constant(rng.normal(1.0, 0.5, (N // 256, 256)).astype("float32")), dtype)
    y = dropout(x, 0.1, keras.random.SeedGenerator(1), portable=portable)
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


# Published known-answer vectors of Philox-4x32-10 (Random123's kat_vectors):
# counter words, key words, output words.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_philox_matches_the_published_vectors(counter, key, expected):
    words = philox_dropout.philox_4x32([tf.constant([c], tf.uint32) for c in counter],
                                       [tf.constant(k, tf.uint32) for k in key])
    assert tuple(int(w.numpy()[0]) for w in words) == expected


def test_philox_matches_tensorflows_own_kernel():
    # TensorFlow's stateless Philox (alg 1) from counter (c, 0, 0, 0): its
    # 4 * 64 raw words are those of counters c, c + 1, ... in order.
    key, start = (0x12345678, 0x9ABCDEF0), 7
    counters = tf.cast(tf.range(start, start + 64), tf.uint32)
    zeros = tf.zeros_like(counters)
    ours = tf.stack(philox_dropout.philox_4x32(
        (counters, zeros, zeros, zeros), [tf.constant(k, tf.uint32) for k in key]), -1)
    theirs = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[256], key=tf.constant([key[1] << 32 | key[0]], tf.uint64),
        counter=tf.constant([start, 0], tf.uint64), alg=1, dtype=tf.uint32)
    np.testing.assert_array_equal(tf.reshape(ours, [-1]).numpy(), theirs.numpy())


def test_tensorflow_path_draws_its_mask_from_philox():
    # With an int seed the key is `(seed, 0)`: the mask is exactly the
    # Philox halfwords at or above the threshold (the fused path is the one
    # that runs, not the portable one).
    x = tf.ones((8, 6, 5))
    y = dropout(x, 0.3, 11)
    bits = philox_dropout.random_halfwords(tf.shape(x), [tf.constant(11, tf.uint32),
                                                         tf.constant(0, tf.uint32)])
    np.testing.assert_array_equal(y.numpy() != 0, bits.numpy() >= keep_threshold(0.3))
    portable = dropout(x, 0.3, 11, portable=True)
    assert (portable.numpy() != 0).mean() > 0.5  # a valid mask too, from other bits
    assert not np.array_equal(portable.numpy() != 0, y.numpy() != 0)


@pytest.mark.parametrize("size", [1, 7, 8, 9, 40320, 40960, 40961, 2**20, 2**20 + 1, 10**7])
def test_bits_are_drawn_for_a_rounded_length_and_equal_the_exact_draw(size):
    length = int(philox_dropout.bits_length(size))
    assert size <= length <= max(8, size * 1.25 + 8) and length % 8 == 0
    if size <= 2**20 + 1:
        key = tf.constant([5, 9], tf.uint32)
        drawn = philox_dropout.draw_bits(size, key).numpy()
        assert drawn.shape == (length,) and drawn.dtype == np.uint16
        exact = philox_dropout.random_halfwords(tf.constant([size]), tf.unstack(key))
        np.testing.assert_array_equal(drawn[:size], exact.numpy())


def test_new_shapes_mostly_reuse_the_generator_s_lengths():
    # Activation sizes of a token-budgeted batch vary by a few percent from
    # step to step: they fall on few generator lengths (each one compiles
    # the generator once), and the per-shape cluster has no generator in it.
    sizes = [b * t * 128 for b in range(12, 17) for t in range(20, 27)]
    lengths = {int(philox_dropout.bits_length(n)) for n in sizes}
    assert len(lengths) <= 4 < len(set(sizes))
    x = tf.ones((3, 5, 8))
    bits = philox_dropout.draw_bits(tf.size(x), tf.constant([1, 2], tf.uint32))
    graph = philox_dropout._forward.get_concrete_function(
        x, x, bits, tf.constant(1, tf.int32), tf.constant(1.0)).graph
    assert not any(t.dtype == tf.uint64 for op in graph.get_operations() for t in op.outputs)
    generator = philox_dropout._bits.get_concrete_function(
        philox_dropout.bits_length(tf.size(x)), tf.constant([1, 2], tf.uint32)).graph
    assert any(t.dtype == tf.uint64 for op in generator.get_operations() for t in op.outputs)


@pytest.mark.parametrize("portable", [False, True], ids=["philox_xla", "keras_random"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_residual_add_and_its_gradients(dtype, portable):
    rng = np.random.default_rng(3)
    x, residual = (tf.cast(tf.constant(rng.normal(size=(4, 16, 32)).astype("float32")), dtype)
                   for _ in range(2))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, residual])
        alone = dropout(x, 0.2, 6, portable=portable)
        added = dropout(x, 0.2, 6, residual=residual, portable=portable)
        weights = tf.cast(tf.constant(rng.normal(size=(4, 16, 32)).astype("float32")), dtype)
        loss = tf.reduce_sum(tf.cast(added * weights, tf.float32))
    assert added.dtype == residual.dtype
    # Same seed, same mask; the sum is rounded once (fused) or twice.
    tolerance = 1e-6 if dtype == "float32" else 2**-7
    as32 = lambda t: tf.cast(t, tf.float32).numpy()  # noqa: E731
    np.testing.assert_allclose(as32(added), as32(alone) + as32(residual), rtol=tolerance,
                               atol=tolerance)
    kept = as32(alone) != 0
    scale = 65536 / (65536 - keep_threshold(0.2))
    dx, dresidual = tape.gradient(loss, [x, residual])
    np.testing.assert_allclose(as32(dresidual), as32(weights))
    np.testing.assert_allclose(as32(dx), kept * scale * as32(weights), rtol=tolerance)


def test_same_mask_inside_an_xla_compiled_function():
    # Whole-step XLA (`jit_compile=True`) nests the fused cluster in another.
    x = tf.random.normal((16, 24))

    @tf.function(jit_compile=True)
    def compiled(x):
        return dropout(x, 0.1, 21, residual=x)

    np.testing.assert_allclose(compiled(x).numpy(), dropout(x, 0.1, 21, residual=x).numpy(),
                               rtol=1e-6)


def test_validation_and_config():
    with pytest.raises(ValueError, match="rate"):
        Dropout(1.0)
    with pytest.raises(ValueError, match="rate"):
        Dropout(-0.1)
    clone = Dropout.from_config(Dropout(0.3, seed=7).get_config())
    assert (clone.rate, clone.seed) == (0.3, 7)


@pytest.mark.numerics
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_dropout_add_norm_equals_the_unfused_layers(dtype):
    # LayerNorm(residual + dropout(x)) in one cluster against dropout with
    # the residual add, then layer_norm: same key, so the same mask; values
    # and all four gradients agree.
    from keras_transformer.layers.residual import ResidualNorm
    from keras_transformer.ops.layer_norm import layer_norm

    rng = np.random.default_rng(8)
    x, residual = (tf.cast(tf.constant(rng.normal(size=(4, 16, 32)).astype("float32")), dtype)
                   for _ in range(2))
    gamma = tf.constant(rng.normal(1.0, 0.2, 32).astype("float32"))
    beta = tf.constant(rng.normal(0.0, 0.2, 32).astype("float32"))
    weights = tf.constant(rng.normal(size=(4, 16, 32)).astype("float32"))
    rate, eps = 0.2, 1e-6

    def run(fused):
        with tf.GradientTape() as tape:
            tape.watch([x, residual, gamma, beta])
            if fused:
                out = philox_dropout.dropout_add_norm(x, residual, gamma, beta, eps,
                                                      keep_threshold(rate), keep_scale(rate), 9)
            else:
                out = layer_norm(dropout(x, rate, 9, residual=residual), gamma, beta, eps)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) * weights)
        return [tf.cast(t, tf.float32).numpy()
                for t in [out] + tape.gradient(loss, [x, residual, gamma, beta])]

    # bfloat16: the unfused path rounds the sum to bfloat16 before the norm.
    tolerance = 2e-5 if dtype == "float32" else 5e-2
    for fused, unfused in zip(run(True), run(False)):
        np.testing.assert_allclose(fused, unfused, rtol=tolerance, atol=tolerance)

    # The layer takes the fused path when training (post-LN, TensorFlow).
    x, residual = tf.cast(x, tf.float32), tf.cast(residual, tf.float32)
    layer = ResidualNorm(dropout=rate, epsilon=eps)
    layer.build(x.shape)
    state = layer.residual_dropout.seed_generator.state.numpy()
    out = layer(residual, x, training=True)
    generator = keras.random.SeedGenerator(0)
    generator.state.assign(state)
    expected = philox_dropout.dropout_add_norm(x, residual, tf.ones([32]), tf.zeros([32]), eps,
                                               keep_threshold(rate), keep_scale(rate), generator)
    np.testing.assert_array_equal(tf.cast(out, tf.float32).numpy(),
                                  tf.cast(expected, tf.float32).numpy())
