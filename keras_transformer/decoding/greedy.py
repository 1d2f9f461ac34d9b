"""Greedy search: the most probable next token at every step. `keras.ops`
only, with fixed-shape loop state, so it runs on any backend and under XLA."""

from keras_transformer.decoding.sampling import sampling_search


def greedy_search(symbols_to_logits_fn, initial_ids, initial_cache, max_decode_length,
                  eos_id, pad_id=0, min_length=0):
    """Decodes `argmax` tokens until every sentence has produced `eos_id` or
    `max_decode_length` tokens.

    Args:
        symbols_to_logits_fn: `(ids (batch,), step, cache) -> (logits
            (batch, vocab), cache)`: `ids` is the token at position `step`
            (the start token at step 0), `step` a scalar int32, `cache` a
            nested structure of tensors with batch as axis 0.
        initial_ids: `(batch,)` int, the start token of each sentence.
        initial_cache: the cache for step 0 (nested structure, axis 0 = batch).
        max_decode_length: int or scalar int tensor, the most tokens to
            generate (eos included).
        eos_id: the end-of-sentence id.
        pad_id: written after a sentence's eos.
        min_length: eos is not chosen before this many other tokens (see
            `sampling_search`).

    Returns:
        `(sequences (batch, max_decode_length) int32, scores (batch,) float32)`:
        the generated tokens (eos included, `pad_id` after it) and the sum of
        their log-probabilities.
    """
    # Sampling at temperature 0 takes the argmax: one loop for both.
    return sampling_search(symbols_to_logits_fn, initial_ids, initial_cache, max_decode_length,
                           eos_id, pad_id=pad_id, temperature=0.0, min_length=min_length)
