"""Greedy search: the most probable next token at every step. `keras.ops`
only, with fixed-shape loop state, so it runs on any backend and under XLA."""

from keras import ops

from keras_transformer.decoding.common import (
    SCORE_DTYPE,
    log_softmax,
    resolve_max_length,
    write_position,
)


def greedy_search(symbols_to_logits_fn, initial_ids, initial_cache, max_decode_length,
                  eos_id, pad_id=0):
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

    Returns:
        `(sequences (batch, max_decode_length) int32, scores (batch,) float32)`:
        the generated tokens (eos included, `pad_id` after it) and the sum of
        their log-probabilities.
    """
    max_length = resolve_max_length(max_decode_length)
    initial_ids = ops.cast(initial_ids, "int32")
    batch_size = ops.shape(initial_ids)[0]
    state = {
        "step": ops.convert_to_tensor(0, "int32"),
        "sequences": ops.full((batch_size, max_length), pad_id, "int32"),
        "last_ids": initial_ids,
        "scores": ops.zeros((batch_size,), SCORE_DTYPE),
        "finished": ops.zeros((batch_size,), "bool"),
        "cache": initial_cache,
    }

    def cond(state):
        return ops.logical_and(
            ops.less(state["step"], max_length),
            ops.logical_not(ops.all(state["finished"])),
        )

    def body(state):
        step, finished = state["step"], state["finished"]
        logits, cache = symbols_to_logits_fn(state["last_ids"], step, state["cache"])
        log_probs = log_softmax(logits)
        next_ids = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        next_log_prob = ops.squeeze(
            ops.take_along_axis(log_probs, ops.expand_dims(next_ids, -1), axis=-1), -1
        )
        next_ids = ops.where(finished, pad_id, next_ids)
        return {
            "step": step + 1,
            "sequences": write_position(state["sequences"], next_ids, step),
            "last_ids": next_ids,
            "scores": state["scores"] + ops.where(finished, 0.0, next_log_prob),
            "finished": ops.logical_or(finished, ops.equal(next_ids, eos_id)),
            "cache": cache,
        }

    state = ops.while_loop(cond, body, state)
    return state["sequences"], state["scores"]
