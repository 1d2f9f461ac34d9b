"""The position-wise linear map `x W + b` (`layers/dense.py`, sections 3.2
and 3.3) for float32 training on TensorFlow where it multiplies with Eigen,
with its gradient written out so that products whose result rows are a
multiple of 2,048 floats are computed in column slices
(`kernels/eigen_slices.py`); `keras_transformer.dispatch.dense` decides.

The forward pass is the same ops as `keras.layers.Dense` (`MatMul`,
`BiasAdd`, `Relu`, which Grappler fuses into one kernel); the gradients are
the same products in another layout. TensorFlow only.
"""

import tensorflow as tf

from keras_transformer.kernels import eigen_slices


def dense(x, kernel, bias=None, relu=False, sliced_inputs=False, sliced_outputs=False):
    """`x kernel + bias`, then ReLU when `relu`; gradient written out.

    Args:
        x: `(rows, d_in)`.
        kernel: `(d_in, d_out)`, same dtype as `x`; a tensor or a variable.
        bias: `(d_out,)`, a tensor or a variable, or None.
        relu: whether ReLU follows (the feed-forward network's inner layer).
        sliced_inputs: the input's gradient (`d_in` columns) in slices.
        sliced_outputs: the forward product and the kernel's gradient
            (`d_out` columns) in slices.

    Returns: `(rows, d_out)`. Gradients for `x`, `kernel` and `bias`.
    """
    # Variables are read here, outside the custom gradient, so that the
    # tape takes them as inputs of it (TensorFlow requires that, or a
    # `variables` argument).
    x, kernel = tf.convert_to_tensor(x), tf.convert_to_tensor(kernel)
    bias = None if bias is None else tf.convert_to_tensor(bias)
    d_out = kernel.shape[1]

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
