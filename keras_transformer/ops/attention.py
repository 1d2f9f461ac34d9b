"""Scaled dot-product attention, paper section 3.2.1, equation (1).

Mask convention (the same as `keras.layers.MultiHeadAttention`): a mask entry
that is True (or 1) means the query MAY attend to that key; False (or 0)
hides it. Every mask in this package is built by
`keras_transformer.layers.masks` and means "visible".
"""

import math

from keras import ops

from keras_transformer.ops.shapes import size

# Softmax runs in float32 even under a mixed-precision policy; this is a large
# finite negative for float32 (not -inf, so that a fully masked row gives a
# uniform distribution instead of NaN, and `x * 0` stays 0).
_MASK_VALUE = -1e9


def scaled_dot_product_attention(q, k, v, mask=None, dropout=None, training=None):
    """softmax(Q K^T / sqrt(d_k)) V, paper equation (1).

    Args:
        q: queries, `(..., q_len, d_k)`.
        k: keys, `(..., k_len, d_k)`.
        v: values, `(..., k_len, d_v)`.
        mask: optional boolean, broadcastable to `(..., q_len, k_len)`;
            True = may attend.
        dropout: optional `Dropout` layer applied to the weights.
        training: passed to `dropout`.

    Returns:
        `(output, attention_weights)`: `(..., q_len, d_v)` in the dtype of
        `v`, and `(..., q_len, k_len)` in float32.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    q = keras.random.normal((2, 4, 3, 8))           # (batch, heads, q_len, depth)
    k = v = keras.random.normal((2, 4, 5, 8))
    output, weights = kt.scaled_dot_product_attention(q, k, v)
    assert tuple(output.shape) == (2, 4, 3, 8) and tuple(weights.shape) == (2, 4, 3, 5)
    ```
    """
    d_k = size(q, -1)
    # Scale the queries rather than the logits: q_len x d_k multiplies instead
    # of q_len x k_len, and the same result.
    q = ops.multiply(q, ops.cast(1.0 / math.sqrt(d_k), q.dtype))
    logits = ops.matmul(q, ops.swapaxes(k, -1, -2))
    logits = ops.cast(logits, "float32")
    if mask is not None:
        logits = ops.where(ops.cast(mask, "bool"), logits, _MASK_VALUE)
    if logits.shape[-1] == 1:
        # One key (a one-token target's self-attention, e.g. the first step
        # of a decoding loop that re-runs the model on the growing target):
        # softmax over it is exp(l - l) = 1, NaN for NaN, as written here
        # because Keras's softmax warns on a size-1 axis ("Did you mean to
        # use a sigmoid instead?"), a classifier's mistake, not this.
        weights = ops.exp(logits - logits)
    else:
        weights = ops.softmax(logits, axis=-1)
    dropped = weights if dropout is None else dropout(weights, training=training)
    output = ops.matmul(ops.cast(dropped, v.dtype), v)
    return output, weights
