"""Residual connection around a sub-layer, with layer normalization
(paper section 3.1) and residual dropout (section 5.4)."""

import keras

from keras_transformer import dispatch
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.layer_norm import LayerNormalization


@keras.saving.register_keras_serializable(package="keras_transformer")
class ResidualNorm(keras.layers.Layer):
    """`LayerNorm(x + Dropout(Sublayer(x)))`, or the pre-LN variant.

    Post-LN (the paper, `norm_first=False`):
        `x = LayerNorm(x + Dropout(sublayer(x)))`
    Pre-LN (`norm_first=True`, trains deep stacks more stably):
        `x = x + Dropout(sublayer(LayerNorm(x)))`

    Used in two halves around the sub-layer, so the sub-layer can take extra
    arguments (masks, caches):

        h = block.normalize_input(x)
        y = sublayer(h)
        x = block.add(x, y, training)

    Args:
        dropout: P_drop on the sub-layer output.
        norm_first: pre-LN when True.
        epsilon: LayerNorm epsilon.
    """

    def __init__(self, dropout=0.0, norm_first=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        # Position-wise: an input's Keras mask holds for the output too (as
        # for Keras's own Dense, Dropout and LayerNormalization).
        self.supports_masking = True
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        self.norm = LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="norm")
        self.residual_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, x_shape):
        self.norm.build(x_shape)
        self.built = True

    def normalize_input(self, x):
        return self.norm(x) if self.norm_first else x

    def add(self, x, sublayer_output, training=None):
        if self.norm_first:
            return self.residual_dropout(sublayer_output, training=training, residual=x)
        return dispatch.dropout_add_norm(sublayer_output, x, self.norm, self.residual_dropout,
                                         training=training)

    def call(self, x, sublayer_output, training=None):
        return self.add(x, sublayer_output, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            dropout=self.dropout, norm_first=self.norm_first, epsilon=self.epsilon
        )
        return config
