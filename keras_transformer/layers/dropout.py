"""Dropout (paper section 5.4, "Residual Dropout"), from 16 random bits
per element.

Keras's dropout on TensorFlow draws one uniform float per element in the
input's dtype. That has two costs here:
- speed: the random numbers are most of a dropout's time on CPU, and a
  Transformer applies dropout ~30 times per training step;
- under `mixed_bfloat16`, a bfloat16 uniform has 8 significant bits, so the
  keep decision `u >= rate` is coarse and the scaled output is biased (its
  mean came out 0.9964 instead of 1 for rate 0.1; `tests/test_dropout.py`).

This dropout draws one 32-bit random integer for every two elements and
keeps an element when its 16 bits are at least `round(rate * 65536)`. The
effective rate is that threshold / 65536 (0.1 -> 0.1000061), and kept
elements are scaled by the inverse of that keep probability, in float32
even for half-precision inputs, so the output's expectation is the input up
to one rounding of each product. The portable version is pure `keras.ops`
and `keras.random`, so it runs on every backend. On TensorFlow the same
dropout runs as one XLA cluster with the random bits from Philox-4x32-10
written out in integer ops, fused with the residual add that follows a
sub-layer's dropout (`keras_transformer/philox_dropout.py`): the same
threshold, scale and statistics, from a different stream of bits.
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


def dropout(x, rate, seed, residual=None, portable=False):
    """Zeroes each element of `x` with probability `keep_threshold(rate) /
    65536` and scales the others by the inverse of the keep probability;
    adds `residual` after, when given.

    Args:
        x: any shape, float.
        rate: float in [0, 1).
        seed: a `keras.random.SeedGenerator` (or an int seed).
        residual: optional, `x`'s shape: returns `residual + dropout(x)`
            (the sub-layer connection of section 5.4).
        portable: use the `keras.ops` version on TensorFlow too (tests
            compare the two); other backends always use it.

    Returns: same shape and dtype as `x` (`residual`'s dtype when given).
    """
    threshold = keep_threshold(rate)
    if threshold == 0:
        return x if residual is None else residual + x
    scale = keep_scale(rate)
    if keras.backend.backend() == "tensorflow" and not portable:
        from keras_transformer import philox_dropout

        return philox_dropout.dropout(x, threshold, scale, seed, residual)
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


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Layer):
    """Inverted dropout with 16-bit randomness (see the module docstring).

    Args:
        rate: fraction of elements to zero, in [0, 1); 0 is the identity.
        seed: optional int, for reproducible masks.

    Call: `x` (any shape), `training`: dropout only when True; `residual`
    (optional, `x`'s shape): returns `residual + dropout(x)`, fused on
    TensorFlow.
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        # Position-wise: an input's Keras mask holds for the output too (as
        # for Keras's own Dense, Dropout and LayerNormalization).
        self.supports_masking = True
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"`rate` must be in [0, 1), received {rate}.")
        self.rate = rate
        self.seed = seed
        if keep_threshold(rate) > 0:
            self.seed_generator = keras.random.SeedGenerator(seed)
        self.built = True

    def call(self, x, training=False, residual=None):
        if training and keep_threshold(self.rate) > 0:
            return dropout(x, self.rate, self.seed_generator, residual)
        return x if residual is None else residual + x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config
