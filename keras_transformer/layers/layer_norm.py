"""Layer normalization (paper section 3.1: `LayerNorm(x + Sublayer(x))`,
after Ba et al. 2016), with its gradient written out.

`keras.layers.LayerNormalization` builds the statistics from `moments` and
lets autodiff differentiate them: on TensorFlow that is ~20 small ops per
layer in the backward pass, and a Transformer has one norm per sub-layer.
The closed-form gradient below is a handful of ops; in the bench training
step (15 norms) it is about a quarter faster than Keras's layer, with
gradients equal to float32 rounding (`tests/test_layer_norm.py` checks both
against Keras's). Pure `keras.ops`, so it runs on every backend.

Only training takes the written-out gradient. Outside it the layer is the
same forward ops without `custom_gradient`: an inference graph (a served
beam search) needs no gradient, and on TensorFlow a custom gradient traced
into a SavedModel is either saved as an extra function per norm or, left
out, makes every `tf.saved_model.load` warn that the model has "ops with
unsaved custom gradients". Autodiff still differentiates the inference
form (e.g. for gradients with respect to the input of a frozen model).
"""

import keras
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


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.Layer):
    """Layer normalization over the last axis, with a learned scale `gamma`
    and offset `beta` (the same weights, names and results as
    `keras.layers.LayerNormalization(epsilon=...)`, so checkpoints carry
    over).

    Args:
        epsilon: added to the variance (1e-6 in this package's configs).

    Call: `(x, training=None)`: `(..., d)` -> `(..., d)` in the layer's
    compute dtype; the closed-form gradient when `training` is true.
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        # Position-wise: an input's Keras mask holds for the output too (as
        # for Keras's own Dense, Dropout and LayerNormalization).
        self.supports_masking = True
        if not epsilon > 0:
            raise ValueError(f"`epsilon` must be > 0, received {epsilon}.")
        self.epsilon = epsilon
        # Statistics need float32 under mixed precision: the weights are not
        # cast to the compute dtype.
        self.autocast = False

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ValueError(
                "The last axis of a LayerNormalization input must be known, "
                f"received shape {input_shape}."
            )
        self.gamma = self.add_weight(name="gamma", shape=(d,), initializer="ones",
                                     autocast=False)
        self.beta = self.add_weight(name="beta", shape=(d,), initializer="zeros",
                                    autocast=False)
        self.built = True

    def call(self, x, training=None):
        gamma = ops.cast(self.gamma, "float32")
        beta = ops.cast(self.beta, "float32")
        y = layer_norm(x, gamma, beta, self.epsilon, written_out_gradient=bool(training))
        return ops.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config
