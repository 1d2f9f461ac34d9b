"""The encoder (paper section 3.1, left half of Figure 1)."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.residual import ResidualNorm


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention then a feed-forward network, each in a `ResidualNorm`.

    Args:
        d_model, num_heads, d_ff: sizes (Table 3).
        dropout: residual dropout P_drop (5.4).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward network.
        norm_first: pre-LN instead of the paper's post-LN.
        epsilon: LayerNorm epsilon.

    Call arguments:
        x: `(batch, src_len, d_model)`.
        mask: `(batch, 1, 1, src_len)` boolean, True = real token.
        return_attention_weights: also return `(batch, heads, src_len, src_len)`.

    Returns: `x` of the same shape, or `(x, weights)`.
    """

    def __init__(
        self,
        d_model,
        num_heads,
        d_ff,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        norm_first=False,
        epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            d_model, num_heads, dropout=attention_dropout, dtype=policy,
            name="self_attention",
        )
        self.self_attention_block = ResidualNorm(
            dropout, norm_first, epsilon, dtype=policy, name="self_attention_block"
        )
        self.feed_forward = PositionwiseFeedForward(
            d_model, d_ff, dropout=activation_dropout, dtype=policy, name="feed_forward"
        )
        self.feed_forward_block = ResidualNorm(
            dropout, norm_first, epsilon, dtype=policy, name="feed_forward_block"
        )

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.self_attention_block.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_block.build(x_shape)
        self.built = True

    def call(self, x, mask=None, training=None, return_attention_weights=False):
        h = self.self_attention_block.normalize_input(x)
        y, weights = self.self_attention(
            h, h, h, mask, training=training,
            return_attention_weights=return_attention_weights,
        )
        x = self.self_attention_block.add(x, y, training=training)
        h = self.feed_forward_block.normalize_input(x)
        x = self.feed_forward_block.add(
            x, self.feed_forward(h, training=training), training=training
        )
        return (x, weights) if return_attention_weights else x

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            num_heads=self.num_heads,
            d_ff=self.d_ff,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            norm_first=self.norm_first,
            epsilon=self.epsilon,
        )
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(keras.layers.Layer):
    """A stack of `num_layers` `EncoderLayer`s with no weight sharing.

    With `norm_first=True` a final LayerNorm closes the stack (pre-LN leaves
    the residual stream unnormalized otherwise).

    Args: `num_layers` and the `EncoderLayer` arguments.

    Call: `x (batch, src_len, d_model)`, `mask (batch, 1, 1, src_len)` ->
    `(batch, src_len, d_model)`, or `(x, [weights per layer])` when
    `return_attention_weights`.
    """

    def __init__(self, num_layers, d_model, num_heads, d_ff, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, norm_first=False,
                 epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"`num_layers` must be positive, received {num_layers}.")
        self.num_layers = num_layers
        self.layer_kwargs = dict(
            d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout, norm_first=norm_first,
            epsilon=epsilon,
        )
        self.encoder_layers = [
            EncoderLayer(**self.layer_kwargs, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)
        ]
        # Also as attributes: on TensorFlow, `tf.train.Checkpoint(model=...)`
        # does not follow Keras's tracked lists (keras-team/keras#18398 is
        # still open for checkpoints in Keras 3.15), so without these the
        # stack's weights would be missing from every checkpoint.
        for i, layer in enumerate(self.encoder_layers):
            setattr(self, f"layer_{i}", layer)
        self.final_norm = (
            LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="final_norm")
            if norm_first
            else None
        )

    def build(self, x_shape):
        for layer in self.encoder_layers:
            layer.build(x_shape)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        self.built = True

    def call(self, x, mask=None, training=None, return_attention_weights=False):
        all_weights = []
        for layer in self.encoder_layers:
            if return_attention_weights:
                x, weights = layer(x, mask, training=training, return_attention_weights=True)
                all_weights.append(weights)
            else:
                x = layer(x, mask, training=training)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if return_attention_weights else x

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_kwargs)
        return config
