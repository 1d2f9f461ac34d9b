"""What the encoder and decoder have in common (paper section 3.1): layers
built from residual sub-layers of one size, and stacks of such layers."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.masks import PassesKerasMask
from keras_transformer.layers.residual import ResidualNorm


class TransformerLayer(PassesKerasMask, keras.layers.Layer):
    """Base of `EncoderLayer` and `DecoderLayer`: their sizes, their residual
    sub-layers, and their config.

    Args:
        d_model, num_heads, d_ff: sizes (Table 3).
        dropout: residual dropout P_drop (5.4).
        attention_dropout: dropout on attention weights.
        activation_dropout: dropout inside the feed-forward network.
        norm_first: pre-LN instead of the paper's post-LN.
        epsilon: LayerNorm epsilon.
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
        self._create_sublayers()

    def _create_sublayers(self):
        """Assigns the subclass's sub-layers to attributes, in the order
        they run (the order of `self.weights`): called at the end of
        `__init__`, so subclasses keep this constructor and its signature."""
        raise NotImplementedError

    def _attention_sublayer(self, name):
        """A `MultiHeadAttention` named `name` and its `ResidualNorm`,
        `name + "_block"`."""
        return (
            MultiHeadAttention(
                self.d_model, self.num_heads, dropout=self.attention_dropout,
                dtype=self.dtype_policy, name=name,
            ),
            self._residual_norm(f"{name}_block"),
        )

    def _feed_forward_sublayer(self):
        """The `PositionwiseFeedForward` (3.3) and its `ResidualNorm`."""
        return (
            PositionwiseFeedForward(
                self.d_model, self.d_ff, dropout=self.activation_dropout,
                dtype=self.dtype_policy, name="feed_forward",
            ),
            self._residual_norm("feed_forward_block"),
        )

    def _residual_norm(self, name):
        return ResidualNorm(
            self.dropout, self.norm_first, self.epsilon, dtype=self.dtype_policy, name=name
        )

    def _self_attention_residual(self, x, mask, training, return_attention_weights):
        """`x (batch, len, d_model)` through masked self-attention and its
        residual -> `(x, weights or None)`."""
        h = self.self_attention_block.normalize_input(x)
        y, weights = self.self_attention(
            h, h, h, mask, training=training,
            return_attention_weights=return_attention_weights,
        )
        return self.self_attention_block.add(x, y, training=training), weights

    def _feed_forward_residual(self, x, training):
        """`x (batch, len, d_model)` through the feed-forward network and
        its residual."""
        h = self.feed_forward_block.normalize_input(x)
        return self.feed_forward_block.add(
            x, self.feed_forward(h, training=training), training=training
        )

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


class TransformerStack(PassesKerasMask, keras.layers.Layer):
    """Base of `Encoder` and `Decoder`: `num_layers` layers of
    `layer_class` with no weight sharing, in the list attribute named
    `layers_attribute`, and a final LayerNorm when `norm_first` (pre-LN
    leaves the residual stream unnormalized otherwise).

    Args: `num_layers`, then the `TransformerLayer` arguments, and
        layer_drop: LayerDrop (Fan et al., ICLR 2020, "Reducing Transformer
            Depth on Demand with Structured Dropout"): in training each
            layer is skipped for the whole batch with this probability, its
            input passed on unchanged; inference (and a call that returns
            attention weights) runs every layer. The skipped layer is still
            computed and its output discarded (one graph on every backend),
            so an update costs the same. 0 (the default) adds no random
            state, so checkpoints are unchanged.
        seed: optional int, for reproducible layer choices.
    """

    layer_class = None
    layers_attribute = None

    def __init__(self, num_layers, d_model, num_heads, d_ff, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, norm_first=False,
                 epsilon=1e-6, layer_drop=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"`num_layers` must be positive, received {num_layers}.")
        if not 0.0 <= layer_drop < 1.0:
            raise ValueError(f"`layer_drop` must be in [0, 1), received {layer_drop!r}.")
        self.num_layers = num_layers
        self.layer_drop = layer_drop
        self.seed = seed
        if layer_drop > 0:
            self.seed_generator = keras.random.SeedGenerator(seed)
        self.layer_kwargs = dict(
            d_model=d_model, num_heads=num_heads, d_ff=d_ff, dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout, norm_first=norm_first,
            epsilon=epsilon,
        )
        layers = [
            self.layer_class(**self.layer_kwargs, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)
        ]
        setattr(self, self.layers_attribute, layers)
        # Also as attributes: on TensorFlow, `tf.train.Checkpoint(model=...)`
        # does not follow Keras's tracked lists (keras-team/keras#18398 is
        # still open for checkpoints in Keras 3.15), so without these the
        # stack's weights would be missing from every checkpoint.
        for i, layer in enumerate(layers):
            setattr(self, f"layer_{i}", layer)
        self.final_norm = (
            LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="final_norm")
            if norm_first
            else None
        )

    def _build_stack(self, x_shape, *layer_shapes):
        """Builds every layer with `(x_shape, *layer_shapes)`, then the
        final norm; the subclasses' `build` names the shapes (Keras passes
        them by the names of `call`'s arguments)."""
        for layer in getattr(self, self.layers_attribute):
            layer.build(x_shape, *layer_shapes)
        if self.final_norm is not None:
            self.final_norm.build(x_shape)
        self.built = True

    def _final_norm(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def _run_layer(self, layer, x, training, *args, **kwargs):
        """`layer(x, *args, training=training, **kwargs)`, or `x` when
        LayerDrop skips the layer for this batch."""
        y = layer(x, *args, training=training, **kwargs)
        if not training or self.layer_drop == 0:
            return y
        keep = keras.random.uniform((), seed=self.seed_generator) >= self.layer_drop
        return keras.ops.where(keep, y, x)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, **self.layer_kwargs)
        if self.layer_drop:
            config.update(layer_drop=self.layer_drop, seed=self.seed)
        return config
