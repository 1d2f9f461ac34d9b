"""Attention masks (paper sections 3.1 and 3.2.3). True = may attend.

All masks here are boolean and broadcast to `(batch, heads, q_len, k_len)`.
"""

from keras import ops


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
