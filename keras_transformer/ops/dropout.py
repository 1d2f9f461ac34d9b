"""Dropout (paper section 5.4, "Residual Dropout") from 16 random bits per
element, in `keras.ops` and `keras.random`.

A uniform float per element in the input's dtype, as Keras's dropout draws,
is costly (the random numbers are most of a dropout's time on CPU) and,
under `mixed_bfloat16`, coarse: a bfloat16 uniform has 8 significant bits,
so the keep decision `u >= rate` is biased and so is the scaled output.

Here an element is kept when its 16 random bits are at least
`round(rate * 65536)`; the effective rate is that threshold / 65536
(0.1 -> 0.1000061), and kept elements are scaled by the inverse of that keep
probability, in float32 even for half-precision inputs, so the output's
expectation is the input up to one rounding of each product.
`tests/test_dropout.py` checks the statistics.
"""

import math

import keras
from keras import ops

# Random bits per element.
BITS = 16
_LEVELS = 1 << BITS


def keep_threshold(rate):
    """The 16-bit threshold for `rate`: an element is kept when its random
    bits are >= this; the effective rate is `threshold / 65536`."""
    return round(rate * _LEVELS)


def keep_scale(rate):
    """The inverse of the keep probability, `65536 / (65536 - threshold)`."""
    return _LEVELS / (_LEVELS - keep_threshold(rate))


def _random_halfwords(shape, size, seed):
    """`shape` of uniform uint16 random values, from `ceil(size / 2)` int32
    draws (`size` = number of elements)."""
    last = shape[-1] if shape else 1
    if isinstance(last, int) and last % 2 == 0:
        # Common case: an even, static last axis (d_model, d_ff).
        words = keras.random.randint(tuple(shape[:-1]) + (last // 2,), -(2**31),
                                     2**31 - 1, dtype="int32", seed=seed)
        return ops.view(words, "uint16")
    # A static last axis of 1: `ops.view` needs a known last axis on TF.
    words = keras.random.randint(((size + 1) // 2, 1), -(2**31), 2**31 - 1, dtype="int32",
                                 seed=seed)
    return ops.reshape(ops.reshape(ops.view(words, "uint16"), (-1,))[:size], shape)


def dropout(x, rate, seed, residual=None):
    """Zeroes each element of `x` with probability `keep_threshold(rate) /
    65536` and scales the others by the inverse of the keep probability;
    adds `residual` after, when given.

    Args:
        x: any shape, float.
        rate: float in [0, 1).
        seed: a `keras.random.SeedGenerator` (or an int seed).
        residual: optional, `x`'s shape: returns `residual + dropout(x)`
            (the sub-layer connection of section 5.4).

    Returns: same shape and dtype as `x` (`residual`'s dtype when given).
    """
    threshold = keep_threshold(rate)
    if threshold == 0:
        return x if residual is None else residual + x
    scale = keep_scale(rate)
    shape = tuple(ops.shape(x))
    size = math.prod(shape) if all(isinstance(d, int) for d in shape) else ops.size(x)
    bits = _random_halfwords(shape, size, seed)
    keep = ops.greater_equal(bits, ops.cast(threshold, "uint16"))
    if keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16"):
        # The scale rounded to bfloat16 (1.109375 for 0.1) would shrink every
        # kept element by 0.16%; scaling in float32 rounds each product once.
        scaled = ops.cast(ops.cast(x, "float32") * scale, x.dtype)
    else:
        scaled = x * ops.cast(scale, x.dtype)
    dropped = ops.where(keep, scaled, ops.zeros((), x.dtype))
    return dropped if residual is None else residual + dropped
