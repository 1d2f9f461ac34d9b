"""The dropout layer (paper section 5.4), over the 16-bit dropout of
`keras_transformer/ops/dropout.py`; `keras_transformer.dispatch` chooses
the TensorFlow kernel for it where one applies (the same threshold, scale
and statistics, from a different stream of random bits).
"""

import keras

from keras_transformer import dispatch
from keras_transformer.ops.dropout import keep_threshold


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
            return dispatch.dropout(x, self.rate, self.seed_generator, residual)
        return x if residual is None else residual + x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, seed=self.seed)
        return config
