"""The decoder (paper section 3.1, right half of Figure 1), with incremental
decoding against a fixed-shape key/value cache."""

import keras
from keras import ops

from keras_transformer.layers.masks import attention_mask_for, cache_mask
from keras_transformer.layers.transformer_layer import TransformerLayer, TransformerStack
from keras_transformer.ops.shapes import size


def write_cache(cache, update, step, parents=None):
    """Writes `update` `(batch, heads, 1, depth)` into slot `step` of `cache`
    `(batch, heads, max_length, depth)`, after taking the cache's rows
    `parents` `(batch,)` int if given (beam search: row `i` continues the
    hypothesis that was row `parents[i]`).

    A `where` against a one-hot position mask rather than `ops.slice_update`:
    on TensorFlow the latter lowers to `XlaDynamicUpdateSlice`, which a stock
    TF Serving binary cannot run outside XLA. The shape never changes, so the
    loop state stays fixed-shape (XLA-friendly) all the same. Reordering
    here rather than in the search lets XLA fuse the row gather and the
    write into one pass over the cache.
    """
    if parents is not None:
        cache = ops.take(cache, parents, axis=0)
    max_length = size(cache, 2)
    at_step = ops.reshape(ops.equal(ops.arange(max_length), step), (1, 1, -1, 1))
    return ops.where(at_step, ops.cast(update, cache.dtype), cache)


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(TransformerLayer):
    """Masked self-attention, encoder-decoder attention, feed-forward network,
    each in a `ResidualNorm`.

    Args: as `TransformerLayer` (the same as `EncoderLayer`).

    Call arguments:
        x: `(batch, tgt_len, d_model)`.
        memory: encoder output `(batch, src_len, d_model)`.
        self_mask: broadcastable to `(batch, 1, tgt_len, tgt_len)` (causal).
        memory_mask: `(batch, 1, 1, src_len)`, True = real source token;
            or a Keras mask `(batch, src_len)`. Left None, Keras passes
            `memory`'s own Keras mask, if any (`masks.attention_mask_for`).
        return_attention_weights: also return `(self_weights, cross_weights)`.

    Returns: `x` of shape `(batch, tgt_len, d_model)`, or
    `(x, (self_weights, cross_weights))`; `x` keeps the input's Keras mask.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    layer = kt.DecoderLayer(d_model=32, num_heads=4, d_ff=64)
    x, memory = keras.random.normal((2, 4, 32)), keras.random.normal((2, 6, 32))
    causal = keras.ops.tril(keras.ops.ones((4, 4), "bool"))[None, None]
    y = layer(x, memory, self_mask=causal)
    assert tuple(y.shape) == (2, 4, 32)
    ```
    """

    def _create_sublayers(self):
        self.self_attention, self.self_attention_block = self._attention_sublayer(
            "self_attention")
        self.cross_attention, self.cross_attention_block = self._attention_sublayer(
            "cross_attention")
        self.feed_forward, self.feed_forward_block = self._feed_forward_sublayer()

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        self.self_attention.build(x_shape, x_shape, x_shape)
        self.self_attention_block.build(x_shape)
        self.cross_attention.build(memory_shape, memory_shape, x_shape)
        self.cross_attention_block.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_block.build(x_shape)
        self.built = True

    def _cross_attention_and_feed_forward(
        self, x, memory_k, memory_v, memory_mask, training, return_attention_weights
    ):
        h = self.cross_attention_block.normalize_input(x)
        y, cross_weights = self.cross_attention.attend(
            self.cross_attention.project_queries(h), memory_k, memory_v, memory_mask,
            training=training, return_attention_weights=return_attention_weights,
        )
        return self._feed_forward_after_cross_attention(x, y, training), cross_weights

    def _feed_forward_after_cross_attention(self, x, y, training):
        x = self.cross_attention_block.add(x, y, training=training)
        return self._feed_forward_residual(x, training)

    def call(
        self, x, memory, self_mask=None, memory_mask=None, training=None,
        return_attention_weights=False,
    ):
        memory_mask = attention_mask_for(memory, memory_mask)
        x, self_weights = self._self_attention_residual(
            x, self_mask, training, return_attention_weights
        )
        memory_k, memory_v = self.cross_attention.project_keys_and_values(memory, memory)
        x, cross_weights = self._cross_attention_and_feed_forward(
            x, memory_k, memory_v, memory_mask, training, return_attention_weights
        )
        if return_attention_weights:
            return x, (self_weights, cross_weights)
        return x

    # Incremental decoding --------------------------------------------------

    def memory_keys_and_values(self, memory):
        """Encoder-decoder keys and values, computed once per sentence.

        Returns: `(k, v)`, each `(batch, heads, src_len, depth)`.
        """
        return self.cross_attention.project_keys_and_values(memory, memory)

    def empty_cache(self, batch_size, max_length, dtype):
        """Zeroed self-attention keys and values for `max_length` steps.

        Returns: `(k, v)`, each `(batch, heads, max_length, depth)`.
        """
        shape = (batch_size, self.num_heads, max_length, self.d_model // self.num_heads)
        return ops.zeros(shape, dtype), ops.zeros(shape, dtype)

    def decode_step(self, x, step, cache_k, cache_v, memory_k, memory_v, memory_mask,
                    parents=None):
        """One target position against the cache (inference only, no dropout).

        Args:
            x: the embedded token at position `step`, `(batch, 1, d_model)`.
            step: scalar int, 0-based position of `x`.
            cache_k, cache_v: `(batch, heads, max_length, depth)`; slots
                `0 .. step - 1` hold earlier positions.
            memory_k, memory_v: from `memory_keys_and_values`, one row per
                sentence: `(sentences, heads, src_len, depth)`, where
                `batch` is a multiple of `sentences` and rows
                `s * group .. (s + 1) * group - 1` of `x` (a sentence's beams)
                belong to sentence `s`.
            memory_mask: `(sentences, 1, 1, src_len)`.
            parents: optional `(batch,)` int, the cache rows to continue
                (see `write_cache`).

        Returns:
            `(x, cache_k, cache_v)`: `(batch, 1, d_model)` and the caches with
            slot `step` written.
        """
        h = self.self_attention_block.normalize_input(x)
        attention = self.self_attention
        k_new, v_new = attention.project_keys_and_values(h, h)
        cache_k = write_cache(cache_k, k_new, step, parents)
        cache_v = write_cache(cache_v, v_new, step, parents)
        y, _ = attention.attend(
            attention.project_queries(h), cache_k, cache_v,
            cache_mask(step, size(cache_k, 2)),
            training=False, return_attention_weights=False,
        )
        x = self.self_attention_block.add(x, y, training=False)
        # A sentence's beams share its encoder output: their queries attend
        # to it as one group, `(sentences, heads, group, depth)` against the
        # untiled memory, rather than each beam against its own copy (4x
        # less memory read per step at beam 4, and batched matmuls with
        # `group` query rows instead of one).
        cross = self.cross_attention
        h = self.cross_attention_block.normalize_input(x)
        q = cross.project_queries(h)  # (batch, heads, 1, depth)
        rows, sentences = size(q, 0), size(memory_k, 0)
        heads, depth = size(q, 1), size(q, 3)
        # At least 1: an empty batch (a serving request with no sentences)
        # has no rows either, and 0 // 0 is an error at run time.
        group = rows // (max(sentences, 1) if isinstance(sentences, int)
                         else ops.maximum(sentences, 1))
        q = ops.transpose(ops.reshape(q, (sentences, group, heads, depth)), (0, 2, 1, 3))
        y, _ = cross.attend(q, memory_k, memory_v, memory_mask, training=False,
                            return_attention_weights=False)  # (sentences, group, d_model)
        y = ops.reshape(y, (rows, 1, self.d_model))
        return self._feed_forward_after_cross_attention(x, y, False), cache_k, cache_v


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
    """A stack of `num_layers` `DecoderLayer`s (`decoder_layers`) with no
    weight sharing, and a final LayerNorm when `norm_first`.

    Args: `num_layers` and the `DecoderLayer` arguments; `layer_drop`, `seed`: LayerDrop in
    training (`TransformerStack`).

    Call: `x (batch, tgt_len, d_model)`, `memory (batch, src_len, d_model)`,
    masks as in `DecoderLayer` -> `(batch, tgt_len, d_model)`, or
    `(x, [(self_weights, cross_weights) per layer])`.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    decoder = kt.Decoder(num_layers=2, d_model=32, num_heads=4, d_ff=64)
    x, memory = keras.random.normal((2, 4, 32)), keras.random.normal((2, 6, 32))
    causal = keras.ops.tril(keras.ops.ones((4, 4), "bool"))[None, None]
    y, weights = decoder(x, memory, self_mask=causal, return_attention_weights=True)
    assert tuple(y.shape) == (2, 4, 32) and len(weights) == 2
    ```
    """

    layer_class = DecoderLayer
    layers_attribute = "decoder_layers"

    def build(self, x_shape, memory_shape=None):
        self._build_stack(x_shape, memory_shape)

    def call(self, x, memory, self_mask=None, memory_mask=None, training=None,
             return_attention_weights=False):
        all_weights = []
        for layer in self.decoder_layers:
            if return_attention_weights:
                x, weights = layer(
                    x, memory, self_mask=self_mask, memory_mask=memory_mask,
                    training=training, return_attention_weights=True,
                )
                all_weights.append(weights)
            else:
                x = self._run_layer(layer, x, training, memory, self_mask=self_mask,
                                    memory_mask=memory_mask)
        x = self._final_norm(x)
        return (x, all_weights) if return_attention_weights else x

    def init_cache(self, memory, max_length):
        """The decoding state for `memory` `(batch, src_len, d_model)`.

        Returns: a list (one dict per layer) with self-attention `key`/`value`
        caches `(batch, heads, max_length, depth)` and encoder-decoder
        `memory_key`/`memory_value` `(batch, heads, src_len, depth)`.
        """
        batch_size = size(memory, 0)
        cache = []
        for layer in self.decoder_layers:
            memory_k, memory_v = layer.memory_keys_and_values(memory)
            key, value = layer.empty_cache(batch_size, max_length, memory_k.dtype)
            cache.append(
                {"key": key, "value": value, "memory_key": memory_k, "memory_value": memory_v}
            )
        return cache

    @staticmethod
    def grow_cache(cache, max_length):
        """`cache` (as from `init_cache`, or only its `key`/`value` entries)
        with room for `max_length` steps: the self-attention keys and values
        padded with empty slots; nothing else changes."""

        def grow(x):
            extra = max_length - size(x, 2)
            return ops.pad(x, [[0, 0], [0, 0], [0, extra], [0, 0]])

        return [dict(c, key=grow(c["key"]), value=grow(c["value"])) for c in cache]

    def decode_step(self, x, step, cache, memory_mask, parents=None):
        """`x (batch, 1, d_model)` at position `step` -> `(x, new_cache)`;
        `parents`: see `DecoderLayer.decode_step`."""
        new_cache = []
        for layer, layer_cache in zip(self.decoder_layers, cache):
            x, key, value = layer.decode_step(
                x, step, layer_cache["key"], layer_cache["value"],
                layer_cache["memory_key"], layer_cache["memory_value"], memory_mask,
                parents,
            )
            new_cache.append(dict(layer_cache, key=key, value=value))
        return self._final_norm(x), new_cache
