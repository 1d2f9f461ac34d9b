"""Scaled dot-product attention over the heads (paper section 3.2.1,
equation (1)) as one XLA function, for float32 training on TensorFlow where
it multiplies with Eigen.

There, `BatchMatMulV2` on the heads' small matrices is the slow part of the
portable form (`ops/attention.py`); compiled by XLA, the same `keras.ops`
code runs faster, and TensorFlow differentiates it (its gradient is
compiled too). Under oneDNN the portable form is the faster one, and inside
a step that XLA compiles as a whole, a nested compiled function is much
slower, so `keras_transformer.dispatch.attention` takes this only where
neither holds, and only in training: exported serving signatures stay
XLA-free for a stock TF Serving binary.

TensorFlow only.
"""


import functools

import tensorflow as tf

from keras_transformer.ops.attention import scaled_dot_product_attention


# Traced per shape (XLA compiles each shape anyway): `d_k` must be static.
@functools.partial(tf.function, jit_compile=True, autograph=False)
def attention(q, k, v, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V without dropout, compiled.

    Args:
        q: `(batch, heads, q_len, depth)`.
        k, v: `(batch, heads, k_len, depth)`.
        mask: boolean, broadcastable to `(batch, heads, q_len, k_len)`
            (True = may attend), or None.

    Returns: `(batch, heads, q_len, depth)`; the attention weights are not
    returned (training does not use them, and they would be written out).
    """
    return scaled_dot_product_attention(q, k, v, mask)[0]
