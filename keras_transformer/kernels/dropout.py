"""Dropout on TensorFlow as XLA clusters: Philox random bits, the keep
decision, the scaling, the residual add and (post-LN) the layer norm after
it, in one pass.

`ops/dropout.py` defines the dropout (16 random bits per element, kept at
or above a 16-bit threshold, scaled in float32). On TensorFlow its portable
form is five graph ops (TensorFlow's stateless random-integer kernel runs
Philox one counter at a time), plus the residual add and the norm's ~20 ops
after it, each slow in the graph executor in bfloat16. Here the same
generator, Philox-4x32-10 (Salmon et al. 2011, "Parallel random numbers: as
easy as 1, 2, 3"; the generator TensorFlow's stateless ops use), is written
out in integer ops so that XLA vectorizes it. The bits come from a cluster
of their own (`draw_bits`), compiled per rounded length, and the rest is
fused: `dropout` (optionally followed by the residual add) and
`dropout_add_norm` (the post-LN sub-layer connection,
`LayerNorm(x + Dropout(Sublayer(x)))`, sections 3.1 and 5.4) are one cluster
forward and one backward. XLA compiles a cluster for each input shape, and
batches padded to their longest sentence come in many shapes: the
generator, most of a cluster's compile time, is compiled for a few lengths
only (`bits_length`). The same threshold, scale and statistics as the
portable form, from a different stream of bits.

TensorFlow only (`tf.function(jit_compile=True)`); only training runs it,
so exported serving signatures stay XLA-free.
"""


import functools
import math

import tensorflow as tf

from keras_transformer.ops import layer_norm

# Philox-4x32 round multipliers and key increments (Salmon et al., table 2).
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
# Random bits are drawn for a flat length rounded up to one of this many
# sizes per power of two (`bits_length`): each new activation shape then
# compiles only the small cluster that uses them, and few compile the
# generator, whose ten unrolled rounds are most of a cluster's compile time.
# Element i's bits depend on i alone, so the rounding changes no mask.
BITS_STEPS_PER_OCTAVE = 4


def _mulhilo(a, multiplier):
    """`(high, low)` 32-bit halves of the 64-bit product `a * multiplier`."""
    product = tf.cast(a, tf.uint64) * tf.constant(multiplier, tf.uint64)
    return (tf.cast(tf.bitwise.right_shift(product, tf.constant(32, tf.uint64)), tf.uint32),
            tf.cast(product, tf.uint32))


def philox_4x32(counter, key, rounds=ROUNDS):
    """The Philox-4x32 bijection: four uint32 words of random bits per
    counter.

    Args:
        counter: four uint32 tensors of one shape (the 128-bit counters).
        key: two uint32 scalars (the 64-bit key).
        rounds: 10, the generator's standard (and TensorFlow's) round count.

    Returns: four uint32 tensors, the shape of the counter words.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    xor = tf.bitwise.bitwise_xor
    for _ in range(rounds):
        hi0, lo0 = _mulhilo(c0, _MULTIPLIERS[0])
        hi1, lo1 = _mulhilo(c2, _MULTIPLIERS[1])
        c0, c1, c2, c3 = xor(xor(hi1, c1), k0), lo1, xor(xor(hi0, c3), k1), lo0
        k0 = k0 + tf.constant(_KEY_INCREMENTS[0], tf.uint32)
        k1 = k1 + tf.constant(_KEY_INCREMENTS[1], tf.uint32)
    return c0, c1, c2, c3


def random_halfwords(shape, key):
    """Uniform uint16 values of `shape` (a shape tensor): element `i` is
    halfword `i % 8` of Philox's output for counter `(i // 8, 0, 0, 0)`
    under `key` (two uint32 scalars); a key draws up to 2**35 elements."""
    size = tf.reduce_prod(shape)
    counters = tf.cast(tf.range((size + 7) // 8), tf.uint32)
    zeros = tf.zeros_like(counters)
    words = tf.stack(philox_4x32((counters, zeros, zeros, zeros), key), axis=-1)
    halfwords = tf.reshape(tf.bitcast(words, tf.uint16), [-1])
    return tf.reshape(halfwords[:size], shape)


def bits_length(size):
    """How many random halfwords are drawn for `size` elements: `size`
    rounded up to a multiple of `2**floor(log2 size) / BITS_STEPS_PER_OCTAVE`
    (and of 8), so at most a quarter more. An int64 scalar tensor."""
    size = tf.cast(size, tf.int64)
    octave = tf.floor(tf.math.log(tf.cast(tf.maximum(size, 1), tf.float64)) / math.log(2.0))
    step = tf.maximum(tf.cast(tf.pow(tf.constant(2.0, tf.float64), octave), tf.int64)
                      // BITS_STEPS_PER_OCTAVE, 8)
    return (size + step - 1) // step * step


@functools.partial(tf.function, jit_compile=True, autograph=False, reduce_retracing=True)
def _bits(length, key):
    """`random_halfwords([length], key)`: one compilation per `length`."""
    return random_halfwords(tf.reshape(length, [1]), tf.unstack(key))


def draw_bits(size, key):
    """The random halfwords of `size` elements under `key` (a `(2,)` uint32
    tensor), as a 1-D uint16 tensor of `bits_length(size)`: element `i` is
    `random_halfwords`'s element `i`, whatever the padding."""
    return _bits(bits_length(size), key)


def _keep(bits, shape, threshold):
    """The keep mask of `shape` from `draw_bits`'s `bits`: each element's 16
    random bits are >= `threshold`."""
    size = tf.reduce_prod(shape)
    return tf.reshape(bits[:size], shape) >= tf.cast(threshold, tf.uint16)


def _masked(keep, x, scale):
    """`x * scale` where kept, else 0, in float32 even for half-precision
    `x`: the scale rounded to bfloat16 would bias every kept element (see
    ops/dropout.py)."""
    return tf.where(keep, tf.cast(x, tf.float32) * scale, 0.0)


@functools.partial(tf.function, jit_compile=True, autograph=False, reduce_retracing=True)
def _forward(x, residual, bits, threshold, scale):
    """`(residual + dropout(x), keep)`, without `residual` when it is None."""
    keep = _keep(bits, tf.shape(x), threshold)
    dropped = _masked(keep, x, scale)
    if residual is None:
        return tf.cast(dropped, x.dtype), keep
    return tf.cast(tf.cast(residual, tf.float32) + dropped, residual.dtype), keep


@functools.partial(tf.function, jit_compile=True, autograph=False, reduce_retracing=True)
def _backward(upstream, keep, scale):
    return tf.cast(_masked(keep, upstream, scale), upstream.dtype)


@tf.custom_gradient
def _dropout(x, bits, threshold, scale):
    out, keep = _forward(x, None, bits, threshold, scale)

    def grad(upstream):
        return tf.cast(_backward(upstream, keep, scale), x.dtype), None, None, None

    return out, grad


@tf.custom_gradient
def _dropout_add(x, residual, bits, threshold, scale):
    out, keep = _forward(x, residual, bits, threshold, scale)

    def grad(upstream):
        dx = tf.cast(_backward(upstream, keep, scale), x.dtype)
        return dx, upstream, None, None, None

    return out, grad


@functools.partial(tf.function, jit_compile=True, autograph=False, reduce_retracing=True)
def _forward_norm(x, residual, gamma, beta, bits, threshold, scale, epsilon):
    """`(LayerNorm(residual + dropout(x)), keep, x_hat, inverse_std)`."""
    keep = _keep(bits, tf.shape(x), threshold)
    summed = tf.cast(residual, tf.float32) + _masked(keep, x, scale)
    x_hat, inverse_std = layer_norm.normalize(summed, epsilon)
    return tf.cast(x_hat * gamma + beta, residual.dtype), keep, x_hat, inverse_std


@functools.partial(tf.function, jit_compile=True, autograph=False, reduce_retracing=True)
def _backward_norm(upstream, keep, x_hat, inverse_std, gamma, scale):
    """`(d residual, d x)`: through the norm (its row means), then the mask."""
    dsum = layer_norm.normalize_gradient(tf.cast(upstream, tf.float32) * gamma, x_hat,
                                         inverse_std)
    return (tf.cast(dsum, upstream.dtype),
            tf.cast(_masked(keep, dsum, scale), upstream.dtype))


@tf.custom_gradient
def _dropout_add_norm(x, residual, gamma, beta, bits, threshold, scale, epsilon):
    out, keep, x_hat, inverse_std = _forward_norm(x, residual, gamma, beta, bits, threshold,
                                                  scale, epsilon)

    def grad(upstream):
        dresidual, dx = _backward_norm(upstream, keep, x_hat, inverse_std, gamma, scale)
        # gamma's and beta's sums over all rows stay outside XLA: XLA:CPU's
        # column reductions made the fused norm slower than TensorFlow's.
        dgamma, dbeta = layer_norm.affine_gradients(tf.cast(upstream, tf.float32), x_hat)
        return tf.cast(dx, x.dtype), dresidual, dgamma, dbeta, None, None, None, None

    return out, grad


def seed_key(seed):
    """Philox's key (a `(2,)` uint32 tensor) from a
    `keras.random.SeedGenerator` (its next state, so that each call draws a
    new mask, as `keras.random` does) or an int (a fixed key)."""
    if isinstance(seed, int):
        return tf.constant([seed & 0xFFFFFFFF, 0], tf.uint32)
    # The generator's int64 state is `[seed, calls so far]`.
    return tf.cast(seed.next(), tf.uint32)


def dropout(x, threshold, scale, seed, residual=None):
    """`residual + dropout(x)`, or `dropout(x)`, in one XLA cluster.

    Args:
        x: any shape, float.
        threshold: int in [1, 65535]: an element is kept when its 16 random
            bits are >= it.
        scale: float, the inverse of the keep probability.
        seed: a `keras.random.SeedGenerator` or an int (see `seed_key`).
        residual: optional tensor of `x`'s shape, added after dropout (in
            float32, rounded once to `residual`'s dtype).

    Returns: `x`'s shape, `residual`'s dtype when given, else `x`'s.
    Gradients: the mask times `scale` for `x`, the identity for `residual`.
    """
    bits = draw_bits(tf.size(x), seed_key(seed))
    threshold = tf.constant(threshold, tf.int32)
    scale = tf.constant(scale, tf.float32)
    if residual is None:
        return _dropout(x, bits, threshold, scale)
    return _dropout_add(x, residual, bits, threshold, scale)


def dropout_add_norm(x, residual, gamma, beta, epsilon, threshold, scale, seed):
    """`LayerNorm(residual + dropout(x))` (the paper's sub-layer connection,
    sections 3.1 and 5.4) in one XLA cluster forward and one backward.

    Args:
        x, residual: the sub-layer's output and input, one shape `(..., d)`.
        gamma, beta: `(d,)` float32, the norm's scale and offset.
        epsilon: the norm's epsilon.
        threshold, scale, seed: as for `dropout`.

    Returns: `(..., d)` in `residual`'s dtype; statistics in float32 (the
    math of `ops/layer_norm.py`, which this calls).
    """
    return _dropout_add_norm(x, residual, gamma, beta, draw_bits(tf.size(x), seed_key(seed)),
                             tf.constant(threshold, tf.int32), tf.constant(scale, tf.float32),
                             tf.constant(epsilon, tf.float32))
