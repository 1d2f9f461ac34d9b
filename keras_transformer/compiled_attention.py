"""Scaled dot-product attention over the heads (paper section 3.2.1,
equation (1)) as one XLA function, for float32 training on TensorFlow
where it multiplies with Eigen.

`layers/attention.py` computes `softmax(Q K^T / sqrt(d_k)) V` with two
batched matmuls around a mask and a softmax. Where TensorFlow uses oneDNN
that is its fastest form on CPU (as one XLA function it was slower there:
XLA:CPU's small batched dots lose to oneDNN's; benchmarks/README.md, "What
was tried"). Where it uses Eigen (`tensorflow_kernels.py`: no oneDNN, no
GPU), its `BatchMatMulV2` on the heads' small matrices is the slow part: a
`tf.profiler` trace of the float32 bench step on a 2-core AMD EPYC (Zen 3)
host put the step's 54 of them at 176 ms of thread time (3.3 ms each, ~10
GFLOP/s; 0.74 ms each under oneDNN on the AVX-512 host). Compiled by XLA,
one bench-shaped causal self-attention (64 sentences x 32 tokens, 4 heads
of 64), forward and backward, took 6.2-6.9 ms against 9.6-10.8 ms, and the
bench training step was 1.09-1.12x faster (benchmarks/README.md, "The same
host, a sixth session").

The function is the same `keras.ops` code, compiled, and TensorFlow
differentiates it (its gradient is compiled too). TensorFlow only, and only
training takes it (`MultiHeadAttention.attend`): exported serving
signatures stay XLA-free for a stock TF Serving binary. Not inside a step
XLA compiles as a whole (`model.compile(jit_compile=True)`): XLA compiles
the plain form there anyway, and this function nested in it made the bench
step ~60x slower (`tensorflow_kernels.inside_xla_compilation()`).
"""

import functools

import tensorflow as tf

from keras_transformer import tensorflow_kernels


def pays(dtype):
    """Whether attention in `dtype` is faster compiled here: float32 (the
    only precision measured) where TensorFlow multiplies with Eigen."""
    return dtype == "float32" and tensorflow_kernels.multiplies_with_eigen()


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
    from keras_transformer.layers.attention import scaled_dot_product_attention

    return scaled_dot_product_attention(q, k, v, mask)[0]
