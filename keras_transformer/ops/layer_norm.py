"""Layer normalization (paper section 3.1: `LayerNorm(x + Sublayer(x))`,
after Ba et al. 2016), with its gradient written out.

Autodiff of the statistics (`moments`) is ~20 small ops per norm in the
backward pass on TensorFlow; the closed form below is a handful. Pure
`keras.ops`, so it runs on every backend. `tests/test_layer_norm.py`
checks values and gradients against `keras.layers.LayerNormalization`.
"""

from keras import ops


def normalize(x, epsilon):
    """`(x_hat, inverse_std)`: `x` `(..., d)` float32 standardized over the
    last axis, and `r = 1 / sqrt(var + epsilon)` `(..., 1)`."""
    centered = x - ops.mean(x, axis=-1, keepdims=True)
    inverse_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
    return centered * inverse_std, inverse_std


def normalize_gradient(g, x_hat, inverse_std):
    """The gradient through `normalize` for `g = dy * gamma` (float32):
    `r * (g - mean(g) - x_hat * mean(g * x_hat))`, means over the last axis."""
    return inverse_std * (
        g
        - ops.mean(g, axis=-1, keepdims=True)
        - x_hat * ops.mean(g * x_hat, axis=-1, keepdims=True)
    )


def affine_gradients(dy, x_hat):
    """`(dgamma, dbeta)`: `sum(dy * x_hat)` and `sum(dy)` over the leading
    axes, for float32 `dy` and `x_hat` `(..., d)`."""
    leading = tuple(range(len(dy.shape) - 1))
    return ops.sum(dy * x_hat, axis=leading), ops.sum(dy, axis=leading)


def layer_norm(x, gamma, beta, epsilon, written_out_gradient=True):
    """`(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis.

    Statistics, the affine step and the gradient are computed in float32
    whatever the dtype of `x` (as Keras does under mixed precision); the
    result has the dtype of `x`.

    Args:
        x: `(..., d)`.
        gamma, beta: `(d,)` float32.
        epsilon: added to the variance.
        written_out_gradient: differentiate with the closed form below
            (`custom_gradient`); False gives the same forward ops for
            autodiff.

    Returns: `(..., d)`, dtype of `x`.

    Gradient, with `x_hat` the normalized input, `r = 1 / sqrt(var + eps)`
    and `g = dy * gamma` (means over the last axis):
    `dx = r * (g - mean(g) - x_hat * mean(g * x_hat))`,
    `dgamma = sum(dy * x_hat)`, `dbeta = sum(dy)` over the leading axes.
    """
    dtype = x.dtype

    def forward(x, gamma, beta):
        """`(y, x_hat, inverse_std)`: the same ops on both paths."""
        x_hat, inverse_std = normalize(ops.cast(x, "float32"), epsilon)
        return ops.cast(x_hat * gamma + beta, dtype), x_hat, inverse_std

    if not written_out_gradient:
        return forward(x, gamma, beta)[0]

    @ops.custom_gradient
    def normalize_affine(x, gamma, beta):
        y, x_hat, inverse_std = forward(x, gamma, beta)

        def grad(*args, upstream=None):
            dy = ops.cast(args[0] if upstream is None else upstream, "float32")
            dx = normalize_gradient(dy * gamma, x_hat, inverse_std)
            return (ops.cast(dx, dtype),) + affine_gradients(dy, x_hat)

        return y, grad

    return normalize_affine(x, gamma, beta)
