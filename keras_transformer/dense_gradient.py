"""The position-wise linear map (`layers/dense.py`, sections 3.2 and 3.3)
in float32 training on TensorFlow, with its gradient written out so that the
gradient for the inputs multiplies by a transposed copy of the kernel, and,
where TensorFlow multiplies with Eigen, with products in slices.

For `y = x W + b` (`x`: `(rows, d_in)`, `W`: `(d_in, d_out)`), TensorFlow's
gradient computes `dx = dy W^T` as one matmul with `transpose_b=True`, and
Grappler folds any explicit `tf.transpose` of `W` back into that flag. On
this CPU oneDNN's float32 kernel for that form is slow when `W` is at least
as wide as it is tall: `dy (2,048 x 1,024) W^T` for the bench feed-forward
network's `W (256 x 1,024)` ran at 320 GFLOP/s, against 455 with `W^T`
already in memory (the output projection's `(256 x 8,192)` shape: 327 vs
470). Transposing the kernel, 1 MB there, costs far less. The copy is made
on the kernel's bits as integers (`tf.bitcast`), which Grappler does not
fold into the matmul. The bench training step in float32 was 1.02-1.03x
faster (benchmarks/README.md, "What was tried"). In bfloat16 the transposed
form is not slow (the copy made the same matmul slightly slower, 1.60 vs
1.53 ms), so this applies to float32 only; `layers/dense.py` decides.

Where TensorFlow multiplies with Eigen instead of oneDNN (`eigen_slices.py`:
no oneDNN, no GPU), products whose result rows are a multiple of 2,048
floats run at up to half speed; there the layers with 2,048 or 4,096 units
or inputs (the feed-forward network's in `base` and `big`) compute those
products in slices of 1,024 columns. `base`'s float32 training step was
1.05x faster on a 2-core AMD EPYC (Zen 3) host, `big`'s 1.21x, with
bit-identical losses and weights (benchmarks/README.md, "a sixth session").

TensorFlow only. The forward pass is the same ops as `keras.layers.Dense`
(`MatMul`, `BiasAdd`, `Relu`, which Grappler fuses into one oneDNN kernel),
so its values are the same; the gradients are the same matmuls in another
layout, and here even bit-identical to TensorFlow's (all 127 of the bench
model's on a padded batch, and all 85 of the `demo` preset's, in a
`tf.function`, 2026-11-23).
"""

import tensorflow as tf

from keras_transformer import eigen_slices

_SAME_WIDTH_INT = {tf.float32: tf.int32, tf.bfloat16: tf.int16, tf.float16: tf.int16,
                   tf.float64: tf.int64}


def transposed(kernel):
    """`kernel^T` for a 2-D kernel, as a copy in memory: transposed as
    integers of the same width, so Grappler cannot turn the copy into a
    `transpose_b` flag of the matmul that consumes it."""
    as_int = _SAME_WIDTH_INT[kernel.dtype]
    return tf.bitcast(tf.transpose(tf.bitcast(kernel, as_int)), kernel.dtype)


def dense(x, kernel, bias=None, relu=False):
    """`x kernel + bias`, then ReLU when `relu`; gradient written out.

    Where TensorFlow multiplies with Eigen (`eigen_slices.py`), products
    whose result rows are a multiple of 2,048 floats are computed in slices
    of their columns: the forward product and the kernel's gradient for a
    layer that many units wide, the input's gradient for a layer with that
    many inputs (the feed-forward network's layers in `base` and `big`).

    Args:
        x: `(rows, d_in)`.
        kernel: `(d_in, d_out)`, same dtype as `x`; a tensor or a variable.
        bias: `(d_out,)`, a tensor or a variable, or None.
        relu: whether ReLU follows (the feed-forward network's inner layer).

    Returns: `(rows, d_out)`. Gradients for `x`, `kernel` and `bias`.
    """
    # Variables are read here, outside the custom gradient, so that the
    # tape takes them as inputs of it (TensorFlow requires that, or a
    # `variables` argument).
    x, kernel = tf.convert_to_tensor(x), tf.convert_to_tensor(kernel)
    bias = None if bias is None else tf.convert_to_tensor(bias)
    d_in, d_out = kernel.shape
    sliced_outputs = eigen_slices.pays(d_out)
    sliced_inputs = eigen_slices.pays(d_in)

    def affine(x, kernel, bias):
        y = tf.matmul(x, kernel)
        if bias is not None:
            y = tf.nn.bias_add(y, bias)
        return tf.nn.relu(y) if relu else y

    def forward(x, kernel, bias):
        if not sliced_outputs:
            return affine(x, kernel, bias)
        # Bias and ReLU per slice, so that Grappler still fuses them into
        # each slice's matmul.
        sizes = eigen_slices.slice_sizes(d_out)
        kernels = tf.split(kernel, sizes, axis=1)
        biases = [None] * len(sizes) if bias is None else tf.split(bias, sizes)
        return tf.concat([affine(x, k, b) for k, b in zip(kernels, biases)], axis=1)

    def backward(upstream, x, kernel, y):
        if relu:
            upstream = tf.raw_ops.ReluGrad(gradients=upstream, features=y)
        if sliced_inputs:
            dx = eigen_slices.matmul(upstream, kernel, transpose_b=True)
        elif d_out >= d_in:
            dx = tf.matmul(upstream, transposed(kernel))
        else:
            dx = tf.matmul(upstream, kernel, transpose_b=True)
        if sliced_outputs:
            dkernel = eigen_slices.matmul(x, upstream, transpose_a=True)
        else:
            dkernel = tf.matmul(x, upstream, transpose_a=True)
        return dx, dkernel, upstream

    if bias is None:
        @tf.custom_gradient
        def linear(x, kernel):
            y = forward(x, kernel, None)
            return y, lambda upstream: backward(upstream, x, kernel, y)[:2]

        return linear(x, kernel)

    @tf.custom_gradient
    def biased(x, kernel, bias):
        y = forward(x, kernel, bias)

        def grad(upstream):
            dx, dkernel, dy = backward(upstream, x, kernel, y)
            return dx, dkernel, tf.raw_ops.BiasAddGrad(out_backprop=dy)

        return y, grad

    return biased(x, kernel, bias)
