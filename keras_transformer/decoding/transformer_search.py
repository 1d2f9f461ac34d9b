"""Beam and greedy search over a `Transformer`'s incremental decoder.

The model side of decoding: encode once, build the fixed-shape cache, and
hand the search a step function. `keras.ops` only.
"""

from keras import ops

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.greedy import greedy_search

# The paper (section 6.1): beam 4, alpha 0.6, output length <= input + 50.
DEFAULT_BEAM_SIZE = 4
DEFAULT_ALPHA = 0.6
DEFAULT_EXTRA_LENGTH = 50


def decoding_length(source_ids, extra_length, max_length):
    """`min(src_len + extra_length, max_length)`: the most target tokens
    (eos included) for a batch of `source_ids` `(batch, src_len)`; the cap
    keeps target positions inside the model's `config.max_length`."""
    if isinstance(extra_length, int) and extra_length < 0:
        raise ValueError(f"`extra_length` must be >= 0, received {extra_length}.")
    source_length = ops.shape(source_ids)[1]
    if isinstance(source_length, int) and isinstance(extra_length, int):
        return max(1, min(source_length + extra_length, max_length))
    return ops.maximum(
        ops.minimum(ops.cast(source_length, "int32") + ops.cast(extra_length, "int32"),
                    max_length),
        1,
    )


def prepare_decoding(model, source_ids, max_decode_length):
    """Encodes `source_ids` `(batch, src_len)` and returns `(initial_ids
    (batch,), cache, symbols_to_logits_fn)` for `beam_search`/`greedy_search`.

    The cache holds the decoder's per-layer caches (see
    `Transformer.init_decoding_cache`) and the source padding mask, all with
    batch as axis 0, so beam search can tile and reorder them.
    """
    memory, memory_mask = model.encode(source_ids, training=False)
    cache = {
        "decoder": model.init_decoding_cache(memory, max_decode_length),
        "memory_mask": memory_mask,
    }

    def symbols_to_logits_fn(ids, step, cache):
        logits, decoder_cache = model.decode_step(ids, step, cache["decoder"],
                                                  cache["memory_mask"])
        return logits, {"decoder": decoder_cache, "memory_mask": cache["memory_mask"]}

    initial_ids = ops.full((ops.shape(source_ids)[0],), model.config.bos_id, "int32")
    return initial_ids, cache, symbols_to_logits_fn


def beam_search_translate(model, source_ids, beam_size=DEFAULT_BEAM_SIZE,
                          alpha=DEFAULT_ALPHA, extra_length=DEFAULT_EXTRA_LENGTH):
    """Beam search with `model`.

    Args:
        model: a built `Transformer`.
        source_ids: `(batch, src_len)` int, padded with `config.pad_id`
            (ending in eos, as the model was trained).
        beam_size, alpha, extra_length: ints/floats or scalar tensors.

    Returns: `(sequences (batch, beam, max_decode_length) int32, scores
    (batch, beam) float32)`, best first (see `beam_search`).
    """
    config = model.config
    max_decode_length = decoding_length(source_ids, extra_length, config.max_length)
    initial_ids, cache, step_fn = prepare_decoding(model, source_ids, max_decode_length)
    return beam_search(step_fn, initial_ids, cache, beam_size, alpha, max_decode_length,
                       eos_id=config.eos_id, pad_id=config.pad_id)


def greedy_translate(model, source_ids, extra_length=DEFAULT_EXTRA_LENGTH):
    """Greedy search with `model`: `(sequences (batch, max_decode_length)
    int32, scores (batch,) float32)` (see `greedy_search`)."""
    config = model.config
    max_decode_length = decoding_length(source_ids, extra_length, config.max_length)
    initial_ids, cache, step_fn = prepare_decoding(model, source_ids, max_decode_length)
    return greedy_search(step_fn, initial_ids, cache, max_decode_length,
                         eos_id=config.eos_id, pad_id=config.pad_id)
