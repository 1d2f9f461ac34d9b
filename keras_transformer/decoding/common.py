"""Pieces shared by the search strategies, in `keras.ops` (any backend).

Scores and log-probabilities are float32 throughout: the model's logits are
float32 under every dtype policy, and a search accumulates many of them.
"""

import numpy as np
from keras import ops

SCORE_DTYPE = "float32"


def large_negative(dtype=SCORE_DTYPE):
    """A large *finite* negative number for `dtype`, used instead of -inf.

    Finite so that `0 * x` and `x - x` stay finite (no NaN), and small enough
    in magnitude that adding it to itself a few hundred times does not
    overflow: -1e9 for float32/float64/bfloat16, a quarter of the range for
    float16.
    """
    dtype = np.dtype("float32") if str(dtype) == "bfloat16" else np.dtype(str(dtype))
    return -min(1e9, float(np.finfo(dtype).max) / 4.0)


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016),
    as in T2T and Model Garden. `length` counts generated tokens, eos
    included. Returns float32 of `length`'s shape."""
    length = ops.cast(length, SCORE_DTYPE)
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, SCORE_DTYPE))


def write_position(sequences, tokens, position):
    """Writes `tokens` `(...)` into `sequences` `(..., max_length)` at
    `position` (scalar), with a one-hot `where` rather than a slice update
    (which TensorFlow lowers to an XLA-only op; see `layers/decoder.py`)."""
    max_length = ops.shape(sequences)[-1]
    at = ops.equal(ops.arange(max_length), position)
    return ops.where(at, ops.expand_dims(ops.cast(tokens, sequences.dtype), -1), sequences)


def log_softmax(logits):
    """float32 log-probabilities of `logits` `(..., vocab)`, floored at
    `large_negative()` so that tokens masked with -inf stay finite."""
    logits = ops.cast(logits, SCORE_DTYPE)
    log_probs = logits - ops.logsumexp(logits, axis=-1, keepdims=True)
    return ops.maximum(log_probs, large_negative(SCORE_DTYPE))


def resolve_max_length(max_decode_length):
    """At least one step, as an int32 scalar (or a Python int)."""
    if isinstance(max_decode_length, int):
        if max_decode_length <= 0:
            raise ValueError(
                f"`max_decode_length` must be positive, received {max_decode_length}."
            )
        return max_decode_length
    return ops.maximum(ops.cast(max_decode_length, "int32"), 1)
