"""Sampling search: each next token drawn from the model's distribution,
sharpened or flattened by a temperature and cut to the top-k tokens and to
the nucleus (top-p). `keras.ops` only, with fixed-shape loop state, so it
runs on any backend, inside a `tf.function` and under XLA.

The randomness is an input: `noise`, uniforms in `[0, 1)` `(batch,
max_decode_length)` drawn before the search, one per sentence and step. A
step samples by inverse CDF: it takes the first token whose cumulative
filtered probability exceeds `u * total`. No random state lives in the loop,
so the same `noise` gives the same output, in any process and with any
number of concurrent calls (a served signature draws `noise` from its seed
input with a stateless op).
"""

import numbers

import keras
from keras import ops

from keras_transformer.decoding.common import (
    SCORE_DTYPE,
    check_min_length,
    forbid_early_eos,
    log_softmax,
    resolve_max_length,
    write_position,
)
from keras_transformer.decoding.common import top_k as ranked
from keras_transformer.decoding.search_options import check_options
from keras_transformer.ops.shapes import size


def sampling_noise(batch_size, max_decode_length, seed=0):
    """Uniforms in `[0, 1)` `(batch_size, max_decode_length)` float32 for
    `sampling_search`, from `keras.random.uniform` with `seed` (an int gives
    the same uniforms on every call; a `keras.random.SeedGenerator` a new
    draw per call)."""
    return keras.random.uniform((batch_size, max_decode_length), dtype="float32", seed=seed)


def sampling_search(symbols_to_logits_fn, initial_ids, initial_cache, max_decode_length,
                    eos_id, pad_id=0, temperature=1.0, top_k=0, top_p=1.0, noise=None,
                    seed=0, length_limit=None, min_length=0):
    """Decodes sampled tokens until every sentence has produced `eos_id` or
    reached its length limit.

    Each step turns the model's logits into float32 log-probabilities
    `log p`, then:

    - `temperature == 0`: takes `argmax log p`, exactly greedy search (no
      noise is used);
    - otherwise samples from `softmax(log p / temperature)`, restricted to
      its `top_k` most probable tokens (`0`: all), then to the smallest set
      of the most probable remaining ones whose renormalised probability
      reaches `top_p` (`1.0`: all; the most probable token is always kept),
      renormalised. Tokens are ranked by probability, so `top_k=1` is
      greedy search too (but for exactly tied maxima).

    Args:
        symbols_to_logits_fn: `(ids (batch,), step, cache) -> (logits
            (batch, vocab), cache)`, as for `greedy_search`.
        initial_ids: `(batch,)` int, the start token of each sentence.
        initial_cache: the cache for step 0 (nested structure, axis 0 = batch).
        max_decode_length: int or scalar int tensor, the most tokens to
            generate (eos included).
        eos_id: the end-of-sentence id.
        pad_id: written after a sentence's last token.
        temperature: float >= 0 (Python or scalar tensor). Python values
            choose the path when tracing (0: only the argmax is computed); a
            tensor computes both and picks per call.
        top_k: int >= 0 (Python or scalar int tensor); 0 or at least the
            vocabulary size: no cut. A Python int > 0 ranks only `top_k`
            tokens (`ops.top_k`); otherwise each step ranks the whole
            vocabulary. The inverse CDF runs in rank order either way, so
            Python and tensor options give the same samples.
        top_p: float in `(0, 1]` (Python or scalar tensor); 1.0: no cut.
        noise: `(batch, width)` float uniforms in `[0, 1)` with `width >=
            max_decode_length`; step `t` of sentence `b` uses `noise[b,
            t]`. Default: `sampling_noise(batch, max_decode_length, seed)`.
        seed: used only when `noise` is None (see `sampling_noise`).
        length_limit: optional int, scalar or `(batch,)` int tensor: the most
            tokens per sentence (values above `max_decode_length` count as
            `max_decode_length`); a sentence reaching it is finished there
            without eos. Default: `max_decode_length`.
        min_length: int or scalar int tensor: eos is not chosen before
            this many other tokens (`common.forbid_early_eos`: its
            probability is 0 there and the others' renormalised, which the
            scores use). 0: eos may come first.

    Returns:
        `(sequences (batch, max_decode_length) int32, scores (batch,)
        float32)`: the generated tokens (eos included, `pad_id` after the
        last token) and the sum of the *model's* log-probabilities of those
        tokens (`log_softmax(logits)`, before temperature and filtering,
        renormalised without eos where `min_length` forbids it), so
        scores of samples drawn with different settings compare, and with
        `temperature=0` they equal `greedy_search`'s.
    """
    check_sampling_options(temperature, top_k, top_p)
    check_min_length(min_length)
    max_length = resolve_max_length(max_decode_length)
    initial_ids = ops.cast(initial_ids, "int32")
    batch_size = size(initial_ids, 0)
    limit = max_length if length_limit is None else ops.minimum(
        resolve_max_length(length_limit), max_length)
    limit = ops.broadcast_to(ops.cast(limit, "int32"), (batch_size,))
    greedy_only = _static(temperature) == 0.0
    if not greedy_only:
        if noise is None:
            noise = sampling_noise(batch_size, max_length, seed)
        noise = ops.cast(noise, "float32")
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
        log_probs = forbid_early_eos(log_softmax(logits), step, min_length, limit, eos_id)
        next_ids = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        if not greedy_only:
            uniforms = ops.take(noise, step, axis=1)
            sampled = sample_token(log_probs, uniforms, temperature, top_k, top_p)
            next_ids = sampled if _static(temperature) is not None else ops.where(
                ops.greater(temperature, 0), sampled, next_ids)
        next_log_prob = ops.squeeze(
            ops.take_along_axis(log_probs, ops.expand_dims(next_ids, -1), axis=-1), -1
        )
        next_ids = ops.where(finished, pad_id, next_ids)
        return {
            "step": step + 1,
            "sequences": write_position(state["sequences"], next_ids, step),
            "last_ids": next_ids,
            "scores": state["scores"] + ops.where(finished, 0.0, next_log_prob),
            "finished": ops.logical_or(
                ops.logical_or(finished, ops.equal(next_ids, eos_id)),
                ops.greater_equal(step + 1, limit)),
            "cache": cache,
        }

    state = ops.while_loop(cond, body, state)
    return state["sequences"], state["scores"]


def sample_token(log_probs, uniforms, temperature=1.0, top_k=0, top_p=1.0):
    """One token per row of `log_probs` `(batch, vocab)` float32, by inverse
    CDF with `uniforms` `(batch,)` in `[0, 1)` over `softmax(log_probs /
    temperature)` filtered by `top_k` and `top_p` (see `sampling_search`),
    the tokens in rank order (most probable first).
    `temperature` must be > 0 here (a tensor <= 0 is read as 1; the caller
    picks the argmax for those). Returns `(batch,)` int32."""
    if _static(temperature) is None:
        temperature = ops.where(ops.greater(temperature, 0), temperature, 1.0)
    # Relative to the row's maximum, so that a tiny temperature sends the
    # others to -inf (probability 0) but never the maximum (no NaN).
    scaled = (log_probs - ops.max(log_probs, axis=-1, keepdims=True)) / ops.cast(
        temperature, SCORE_DTYPE)
    static_k, static_p = _static(top_k), _static(top_p)
    vocab = log_probs.shape[-1]
    if static_k is not None and static_k > 0 and (vocab is None or static_k < vocab):
        width = int(static_k)
    else:
        width = vocab if vocab is not None else size(log_probs, -1)
    values, indices = ranked(scaled, width)  # descending
    probs = ops.exp(values - ops.logsumexp(values, axis=-1, keepdims=True))
    rank = ops.expand_dims(ops.arange(size(values, -1), dtype="int32"), 0)
    keep = ops.equal(rank, 0)  # the most probable token is always a candidate
    if static_k is not None:  # the top-k cut, if any, is the width ranked
        within_k = ops.ones_like(keep)
    else:
        top_k = ops.cast(top_k, "int32")
        within_k = ops.logical_or(ops.less(rank, top_k), ops.less_equal(top_k, 0))
    if static_p == 1.0:
        within_p = ops.ones_like(keep)
    else:
        # Probability of the better-ranked tokens; a token is kept while
        # that is below top_p (renormalised over the top-k ones).
        kept_k = ops.where(within_k, probs, 0.0)
        before = (ops.cumsum(kept_k, axis=-1) - kept_k) / ops.sum(kept_k, axis=-1,
                                                                 keepdims=True)
        within_p = ops.less(before, ops.cast(top_p, SCORE_DTYPE))
        if static_p is None:  # 1.0 means no cut, whatever the rounding of `before`
            within_p = ops.logical_or(within_p, ops.greater_equal(top_p, 1.0))
    keep = ops.logical_or(keep, ops.logical_and(within_k, within_p))
    pick = _inverse_cdf(ops.where(keep, probs, 0.0), uniforms)
    return ops.cast(ops.squeeze(
        ops.take_along_axis(indices, ops.expand_dims(pick, -1), axis=-1), -1), "int32")


def _inverse_cdf(weights, uniforms):
    """The first index whose cumulative `weights` `(batch, n)` (>= 0, not
    normalised) exceeds `uniforms * total` `(batch,)`: index `i` is taken
    with probability `weights[i] / total`. Never an index of weight 0 (the
    last positive one bounds rounding at `u` near 1). `(batch,)` int32."""
    cdf = ops.cumsum(weights, axis=-1)
    target = ops.expand_dims(ops.cast(uniforms, SCORE_DTYPE) * cdf[:, -1], -1)
    count = ops.sum(ops.cast(ops.less_equal(cdf, target), "int32"), axis=-1)
    index = ops.expand_dims(ops.arange(size(weights, -1), dtype="int32"), 0)
    last_positive = ops.max(ops.where(ops.greater(weights, 0.0), index, 0), axis=-1)
    return ops.minimum(count, last_positive)


def _static(value):
    """`value` as a Python float if it is a Python/NumPy number, else None
    (a tensor)."""
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return float(value)
    return None


def check_sampling_options(temperature, top_k, top_p):
    """Python-side checks of the sampling options that are numbers (tensors
    pass) against `search_options.OPTIONS`: a `ValueError` naming the
    option."""
    check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p},
                  tensors_pass=True)
