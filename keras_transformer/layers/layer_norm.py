"""The layer normalization layer (paper section 3.1), over the math of
`keras_transformer/ops/layer_norm.py`.

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

from keras_transformer.ops.layer_norm import layer_norm


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
