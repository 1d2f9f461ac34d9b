"""Token embeddings and the tied pre-softmax projection (paper section 3.4),
with positions added and dropout applied to the sum (section 5.4)."""

import math

import keras
from keras import ops

from keras_transformer import dispatch
from keras_transformer.config import POSITION_ENCODINGS
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.position_encoding import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
)
from keras_transformer.ops.shapes import leading_axes, size


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Embedding matrix E `(vocab_size, d_model)` used both ways (3.4).

    `call(ids)` returns `E[ids] * sqrt(d_model)`; `logits(x)` returns
    `x E^T`, the pre-softmax projection that shares E. The weights are drawn
    from N(0, d_model^-0.5) so that the scaled embeddings have unit variance.

    Args:
        vocab_size: number of tokens.
        d_model: width.

    Shapes: `call`: `(batch, len)` int -> `(batch, len, d_model)`;
    `logits`: `(batch, len, d_model)` -> `(batch, len, vocab_size)` float32.
    """

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        if vocab_size <= 0 or d_model <= 0:
            raise ValueError(
                "`vocab_size` and `d_model` must be positive, received "
                f"{vocab_size}, {d_model}."
            )
        self.vocab_size = vocab_size
        self.d_model = d_model

    def build(self, ids_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
            # Read as stored (float32) even under mixed precision: `call`
            # casts only the rows it gathers and `logits` the table once.
            # Keras's autocast would cast the whole table at each of the
            # model's three reads (source, target, projection).
            autocast=False,
        )
        self.built = True

    def call(self, ids):
        vectors = ops.take(self.embeddings, ops.cast(ids, "int32"), axis=0)
        return ops.multiply(
            ops.cast(vectors, self.compute_dtype),
            ops.cast(math.sqrt(self.d_model), self.compute_dtype),
        )

    def logits(self, x, training=None):
        """`x E^T` in float32 (softmax and the loss need the range).

        Outside training it is computed as `(E x^T)^T`, the same products:
        TensorFlow's CPU matmul is slow with the large operand transposed
        and few rows, which is every decoding step (XLA compiles the two
        forms alike), through `keras_transformer.dispatch.decoding_logits`;
        in a search traced under `dispatch.using_column_blocks` with row
        blocks of `E` for this layer, a product of few rows is taken block
        by block there (`kernels/column_blocks.py`). Training keeps `x E^T`,
        through `keras_transformer.dispatch.vocabulary_logits`.
        """
        kernel = ops.cast(self.embeddings, x.dtype)
        if training:
            return ops.cast(dispatch.vocabulary_logits(x, kernel), "float32")
        rows = ops.reshape(x, (-1, size(x, -1)))
        logits = dispatch.decoding_logits(self, rows, kernel)
        lead = leading_axes(x, len(x.shape) - 1)
        return ops.cast(ops.reshape(logits, lead + (self.vocab_size,)), "float32")

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model)
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Scaled token embedding + positional encoding, then dropout.

    Args:
        token_embedding: a `TokenEmbedding`, possibly shared with another
            `PositionalEmbedding` (source/target sharing, section 3.4).
        position_encoding: "sinusoidal" (3.5), "learned" (Table 3 row E), or
            "none" (an ablation: no word-order information).
        max_length: size of the learned table (ignored for sinusoidal).
        dropout: P_drop on the sum (5.4).

    Call arguments:
        ids: `(batch, len)` int.
        start_index: position of `ids[:, 0]` (the step in incremental decoding).

    Returns: `(batch, len, d_model)`.
    """

    def __init__(
        self,
        token_embedding,
        position_encoding="sinusoidal",
        max_length=1024,
        dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(token_embedding, dict):
            token_embedding = keras.saving.deserialize_keras_object(token_embedding)
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {POSITION_ENCODINGS}, "
                f"received {position_encoding!r}."
            )
        self.token_embedding = token_embedding
        self.position_encoding = position_encoding
        self.max_length = max_length
        self.dropout = dropout
        if position_encoding == "none":
            self.positions = None
        elif position_encoding == "sinusoidal":
            self.positions = SinusoidalPositionEncoding(
                dtype=self.dtype_policy, name="positions"
            )
        else:
            self.positions = LearnedPositionEmbedding(
                max_length, token_embedding.d_model, dtype=self.dtype_policy,
                name="positions",
            )
        self.embedding_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, ids_shape):
        if not self.token_embedding.built:
            self.token_embedding.build(ids_shape)
        if self.positions is not None:
            self.positions.build(tuple(ids_shape) + (self.token_embedding.d_model,))
        self.built = True

    def call(self, ids, start_index=0, training=None):
        x = self.token_embedding(ids)
        if self.positions is not None:
            x = x + ops.expand_dims(self.positions(x, start_index=start_index), 0)
        return self.embedding_dropout(x, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            token_embedding=keras.saving.serialize_keras_object(self.token_embedding),
            position_encoding=self.position_encoding,
            max_length=self.max_length,
            dropout=self.dropout,
        )
        return config
