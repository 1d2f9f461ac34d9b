"""The encoder (paper section 3.1, left half of Figure 1)."""

import keras

from keras_transformer.layers.masks import attention_mask_for
from keras_transformer.layers.transformer_layer import TransformerLayer, TransformerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(TransformerLayer):
    """Self-attention then a feed-forward network, each in a `ResidualNorm`.

    Args: as `TransformerLayer` (`d_model`, `num_heads`, `d_ff`, `dropout`,
    `attention_dropout`, `activation_dropout`, `norm_first`, `epsilon`).

    Call arguments:
        x: `(batch, src_len, d_model)`.
        mask: `(batch, 1, 1, src_len)` boolean, True = real token; or a
            Keras mask `(batch, src_len)`. Left None, Keras passes `x`'s
            own Keras mask, if any (`masks.attention_mask_for`).
        return_attention_weights: also return `(batch, heads, src_len, src_len)`.

    Returns: `x` of the same shape, or `(x, weights)`; `x` keeps the
    input's Keras mask.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    layer = kt.EncoderLayer(d_model=32, num_heads=4, d_ff=64)
    x = keras.random.normal((2, 5, 32))
    mask = keras.ops.convert_to_tensor([[True] * 5, [True] * 3 + [False] * 2])
    y, weights = layer(x, mask=mask[:, None, None, :], return_attention_weights=True)
    assert tuple(y.shape) == (2, 5, 32) and tuple(weights.shape) == (2, 4, 5, 5)
    ```
    """

    def _create_sublayers(self):
        self.self_attention, self.self_attention_block = self._attention_sublayer(
            "self_attention")
        self.feed_forward, self.feed_forward_block = self._feed_forward_sublayer()

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.self_attention_block.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_block.build(x_shape)
        self.built = True

    def call(self, x, mask=None, training=None, return_attention_weights=False):
        mask = attention_mask_for(x, mask)
        x, weights = self._self_attention_residual(x, mask, training, return_attention_weights)
        x = self._feed_forward_residual(x, training)
        return (x, weights) if return_attention_weights else x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(TransformerStack):
    """A stack of `num_layers` `EncoderLayer`s (`encoder_layers`) with no
    weight sharing, and a final LayerNorm when `norm_first`.

    Args: `num_layers` and the `EncoderLayer` arguments; `layer_drop`, `seed`: LayerDrop in
    training (`TransformerStack`).

    Call: `x (batch, src_len, d_model)`, `mask (batch, 1, 1, src_len)` ->
    `(batch, src_len, d_model)`, or `(x, [weights per layer])` when
    `return_attention_weights`.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    # The encoder stack under a classifier head: a model of your own.
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(1000, 32)(tokens)
    x = kt.Encoder(num_layers=2, d_model=32, num_heads=4, d_ff=64)(x)
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(x))
    classifier = keras.Model(tokens, outputs)
    assert tuple(classifier(keras.ops.ones((2, 7), "int32")).shape) == (2, 3)
    ```
    """

    layer_class = EncoderLayer
    layers_attribute = "encoder_layers"

    def build(self, x_shape):
        self._build_stack(x_shape)

    def call(self, x, mask=None, training=None, return_attention_weights=False):
        all_weights = []
        for layer in self.encoder_layers:
            # `mask=` by keyword: a positional None would clash with the
            # Keras mask that Keras passes to a `mask` argument left None.
            if return_attention_weights:
                x, weights = layer(x, mask=mask, training=training,
                                   return_attention_weights=True)
                all_weights.append(weights)
            else:
                x = self._run_layer(layer, x, training, mask=mask)
        x = self._final_norm(x)
        return (x, all_weights) if return_attention_weights else x
