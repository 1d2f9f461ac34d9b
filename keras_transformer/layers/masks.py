"""Attention masks (paper sections 3.1 and 3.2.3). True = may attend.

All masks here are boolean and broadcast to `(batch, heads, q_len, k_len)`;
Keras's own masks over a sequence's positions, `(batch, len)`, become such
masks in `attention_mask_for`.
"""

from keras import ops

try:
    from keras.src.backend import get_keras_mask as _get_keras_mask
except ImportError:  # Keras versions that keep it only as an attribute
    def _get_keras_mask(tensor):
        return getattr(tensor, "_keras_mask", None)


class TakesAttentionMask:
    """Mixin for a layer whose `mask` call argument is an attention mask (as
    below), not a Keras mask over its input's positions.

    Keras treats a `mask=` keyword as the input's Keras mask, and warns that
    a layer without `compute_mask` "will destroy the mask information".
    Overriding `compute_mask` declares the argument taken: no warning, and
    no mask attached to the output (its shape is not a Keras mask's).
    """

    def compute_mask(self, inputs, previous_mask=None):
        return None


class PassesKerasMask(TakesAttentionMask):
    """`TakesAttentionMask` for a layer with one output position per
    position of its first input (the encoder and decoder layers and
    stacks): that input's Keras mask, if any, is attached to the output, as
    Keras's own sequence layers do. The layer reads Keras masks that Keras
    passes it through `attention_mask_for`.
    """

    def compute_mask(self, inputs, previous_mask=None):
        return keras_mask(inputs)


def keras_mask(tensor):
    """The Keras mask attached to `tensor` (e.g. by
    `keras.layers.Embedding(mask_zero=True)`): `(batch, len)` boolean, True
    = real position; or None. (Keras keeps it as an attribute of the tensor,
    or beside it where the backend's arrays take no attributes, e.g. JAX.)"""
    return _get_keras_mask(tensor)


def attention_mask_for(keys, mask):
    """`mask` for attention over `keys` `(batch, k_len, d)`: a 2-D mask is
    a Keras mask over the keys' positions and becomes the padding mask
    `(batch, 1, 1, k_len)`; any other mask is returned as it is.

    Where a layer's `mask` argument (one tensor input) or `<input>_mask`
    argument (several) is left None, Keras fills it with that input's Keras
    mask, `(batch, k_len)`, True = real position (e.g. from
    `keras.layers.Embedding(mask_zero=True)`). Taken as an attention mask,
    it would broadcast as `(q_len, k_len)`: wrong results where `batch ==
    k_len`, an obscure broadcasting error elsewhere.

    Raises:
        ValueError: a 2-D mask whose known sizes are not `(batch, k_len)`.
    """
    if mask is None:
        return None
    if not hasattr(mask, "shape"):
        mask = ops.convert_to_tensor(mask)
    if len(mask.shape) != 2:
        return mask
    expected = tuple(keys.shape[:2])
    if any(got is not None and want is not None and got != want
           for got, want in zip(mask.shape, expected)):
        raise ValueError(
            f"A 2-D attention mask is a Keras mask over the keys' positions, "
            f"`(batch, k_len)` = {expected} for keys of shape {tuple(keys.shape)}; "
            f"received shape {tuple(mask.shape)}. Pass a pattern over positions "
            f"as `(1, 1, q_len, k_len)`."
        )
    return ops.expand_dims(ops.cast(mask, "bool"), axis=(1, 2))


def padding_mask(ids, pad_id):
    """Hides padded keys.

    Args:
        ids: token ids `(batch, k_len)`.
        pad_id: the padding id (from the tokenizer).

    Returns:
        `(batch, 1, 1, k_len)` boolean, False where `ids == pad_id`.
    """
    return ops.expand_dims(ops.not_equal(ids, pad_id), axis=(1, 2))


def causal_mask(length):
    """Hides future positions: query i sees keys 0..i (section 3.2.3).

    Returns:
        `(1, 1, length, length)` boolean, lower triangular.
    """
    positions = ops.arange(length)
    mask = ops.greater_equal(
        ops.expand_dims(positions, 1), ops.expand_dims(positions, 0)
    )
    return ops.reshape(mask, (1, 1, length, length))


def cache_mask(step, max_length):
    """Causal mask for one decoding step against a fixed-size cache.

    At step `step` (0-based) the new query sits at position `step` and may see
    cache slots 0..step; later slots hold zeros that must stay hidden. This is
    the "causal mask offset by the step": a top-left aligned causal mask would
    let the single query see only slot 0.

    Returns:
        `(1, 1, 1, max_length)` boolean.
    """
    visible = ops.less_equal(ops.arange(max_length), step)
    return ops.reshape(visible, (1, 1, 1, max_length))
