"""Positional encodings (paper section 3.5 and Table 3 row E)."""

import math

import keras
from keras import ops

from keras_transformer.ops.shapes import size


def sinusoidal_position_encoding(length, d_model, start=0, dtype="float32"):
    """The paper's fixed encoding, for positions `start .. start + length - 1`.

        PE(pos, 2i)     = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))

    Computed on the fly, so any length works, including lengths longer than
    any seen in training (the reason the paper chose it, section 3.5).

    Returns:
        `(length, d_model)` tensor of `dtype`.
    """
    if d_model % 2:
        raise ValueError(
            f"The sinusoidal encoding needs an even `d_model`, received {d_model}."
        )
    positions = ops.cast(ops.arange(length) + start, "float32")
    # 1 / 10000^(2i / d_model) for i = 0 .. d_model/2 - 1.
    inv_timescales = ops.exp(
        ops.arange(0, d_model, 2, dtype="float32") * (-math.log(10000.0) / d_model)
    )
    angles = ops.expand_dims(positions, 1) * ops.expand_dims(inv_timescales, 0)
    # Interleave so that even channels are sines and odd channels cosines,
    # exactly as the formula indexes them.
    encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)
    encoding = ops.reshape(encoding, (-1, d_model))
    return ops.cast(encoding, dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Adds nothing and learns nothing: returns the encoding for `inputs`.

    Call arguments:
        inputs: `(batch, length, d_model)`; only its shape is used.
        start_index: position of the first element (the decoding step during
            incremental decoding).

    Returns:
        `(length, d_model)` in the layer's compute dtype.
    """

    def call(self, inputs, start_index=0):
        return sinusoidal_position_encoding(
            size(inputs, 1), size(inputs, -1), start=start_index, dtype=self.compute_dtype
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """A learned table of `max_length` positions (paper Table 3, row E).

    Unlike the sinusoid it cannot go past `max_length`: a statically longer
    input raises at trace time; dynamic lengths are clipped to the last row
    by the gather, so keep inputs within `max_length`.

    Args:
        max_length: number of positions.
        d_model: width.

    Returns (call):
        `(length, d_model)`.
    """

    def __init__(self, max_length, d_model, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if max_length <= 0:
            raise ValueError(f"`max_length` must be positive, received {max_length}.")
        self.max_length = max_length
        self.d_model = d_model
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, self.d_model),
            initializer=self.initializer,
            autocast=False,  # cast the gathered rows, not the table (embedding.py)
        )
        self.built = True

    def call(self, inputs, start_index=0):
        length = size(inputs, 1)
        if isinstance(length, int) and length > self.max_length:
            raise ValueError(
                f"Input length {length} exceeds the learned position table "
                f"({self.max_length} positions). Use the sinusoidal encoding or "
                "a larger `max_length`."
            )
        positions = ops.arange(length) + start_index
        return ops.cast(ops.take(self.embeddings, positions, axis=0), self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            max_length=self.max_length,
            d_model=self.d_model,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config
