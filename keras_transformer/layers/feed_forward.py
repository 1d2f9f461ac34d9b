"""Position-wise feed-forward network (paper section 3.3)."""

import keras

from keras_transformer.layers.dense import Dense
from keras_transformer.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to every position alike.

    Args:
        d_model: input and output width.
        d_ff: inner width (2048 in `base`).
        activation: inner activation (ReLU in the paper).
        dropout: dropout on the inner activations (0 in the paper; some
            implementations use 0.1 here).

    Call: `(batch, length, d_model)` -> `(batch, length, d_model)`.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    ffn = kt.PositionwiseFeedForward(d_model=32, d_ff=128)
    assert tuple(ffn(keras.random.normal((2, 5, 32))).shape) == (2, 5, 32)
    ```
    """

    def __init__(self, d_model, d_ff, activation="relu", dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        # Position-wise: an input's Keras mask holds for the output too (as
        # for Keras's own Dense, Dropout and LayerNormalization).
        self.supports_masking = True
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(
                f"`d_model` and `d_ff` must be positive, received {d_model}, {d_ff}."
            )
        self.d_model = d_model
        self.d_ff = d_ff
        self.activation = activation
        self.dropout = dropout
        self.inner = Dense(
            d_ff, activation=activation, dtype=self.dtype_policy, name="inner"
        )
        self.outer = Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.inner_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, inputs_shape):
        self.inner.build(inputs_shape)
        self.outer.build(tuple(inputs_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.inner(inputs)
        if self.dropout:
            hidden = self.inner_dropout(hidden, training=training)
        return self.outer(hidden)

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            d_ff=self.d_ff,
            activation=self.activation,
            dropout=self.dropout,
        )
        return config
