"""Pieces shared by the search strategies, in `keras.ops` (any backend).

Scores and log-probabilities are float32 throughout: the model's logits are
float32 under every dtype policy, and a search accumulates many of them.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding.search_options import check_options
from keras_transformer.ops.shapes import leading_axes, size

SCORE_DTYPE = "float32"


def large_negative(dtype=SCORE_DTYPE):
    """A large *finite* negative number for `dtype`, used instead of -inf.

    Finite so that `0 * x` and `x - x` stay finite (no NaN), and small enough
    in magnitude that adding it to itself a few hundred times does not
    overflow: -1e9 for float32/float64/bfloat16, a quarter of the range for
    float16.
    """
    dtype = np.dtype("float32") if str(dtype) == "bfloat16" else np.dtype(str(dtype))
    return -min(1e9, float(np.finfo(dtype).max) / 4.0)


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016),
    as in T2T and Model Garden. `length` counts generated tokens, eos
    included. Returns float32 of `length`'s shape."""
    length = ops.cast(length, SCORE_DTYPE)
    return ops.power((5.0 + length) / 6.0, ops.cast(alpha, SCORE_DTYPE))


def write_position(sequences, tokens, position):
    """Writes `tokens` `(...)` into `sequences` `(..., max_length)` at
    `position` (scalar), with a one-hot `where` rather than a slice update
    (which TensorFlow lowers to an XLA-only op; see `layers/decoder.py`)."""
    max_length = size(sequences, -1)
    at = ops.equal(ops.arange(max_length), position)
    return ops.where(at, ops.expand_dims(ops.cast(tokens, sequences.dtype), -1), sequences)


def log_softmax(logits):
    """float32 log-probabilities of `logits` `(..., vocab)`, floored at
    `large_negative()` so that tokens masked with -inf stay finite."""
    logits = ops.cast(logits, SCORE_DTYPE)
    log_probs = logits - ops.logsumexp(logits, axis=-1, keepdims=True)
    return ops.maximum(log_probs, large_negative(SCORE_DTYPE))


def forbid_early_eos(log_probs, step, min_length, limit, eos_id):
    """`log_probs` `(batch, ..., vocab)` float32, normalised, with eos
    removed and the rest renormalised in the rows whose output would end
    before `min_length` tokens that are not eos (`step < min_length`; step
    `t` writes token `t + 1`), except where the step reaches the row's
    `limit` `(batch,)` (there eos is all a beam search may write, so a limit
    of at most `min_length` still gives a hypothesis). The same as masking
    eos's logit before the softmax, as CTranslate2's
    `min_decoding_length` does (so both engines score alike); fairseq's
    `--min-len` masks without renormalising, which ranks the same
    hypotheses for `min_length=1`. With `min_length=1` a non-empty
    sentence never gets an empty translation. `min_length` may be a Python
    int (0: `log_probs` unchanged) or a scalar int tensor."""
    if isinstance(min_length, int) and min_length <= 0:
        return log_probs
    negative = large_negative(SCORE_DTYPE)
    early = ops.logical_and(ops.less(step, ops.cast(min_length, "int32")),
                            ops.less(step + 1, limit))
    early = ops.reshape(early, (-1,) + (1,) * (len(log_probs.shape) - 1))
    is_eos = ops.equal(ops.arange(size(log_probs, -1)), eos_id)
    masked = ops.where(is_eos, negative, log_probs)
    rest = ops.logsumexp(masked, axis=-1, keepdims=True)  # log(1 - P(eos))
    # A row where eos was the only possible token keeps its (floored) values.
    renormalised = ops.where(ops.greater(rest, negative / 2), masked - rest, masked)
    return ops.where(early, ops.maximum(renormalised, negative), log_probs)


def check_min_length(min_length, tensor_ok=True):
    """A `ValueError` for a `min_length` out of `search_options.OPTIONS`'
    range (an int >= 0).

    With `tensor_ok`, a value that is not a number passes unchecked (a
    tensor, which a signature checks in the graph); an exported model's
    setting (`tensor_ok=False`) must be a Python int. `bool` is not an int.
    """
    check_options({"min_length": min_length}, tensors_pass=tensor_ok)


# `top_k` splits a long last axis into chunks of this many entries.
TOP_K_CHUNK = 128


def top_k(x, k, chunk=TOP_K_CHUNK):
    """`ops.top_k(x, k)` over the last axis, exact, and several times faster
    under XLA on CPU for a long last axis (a beam's `beam * vocab`
    candidates), where XLA sorts the whole row.

    The k largest entries of a row lie in the k chunks with the largest
    maxima (any other chunk's maximum is below k entries of other chunks),
    so: one pass for the chunk maxima, a top-k over those, and a top-k over
    the `k * chunk` entries of the chosen chunks. Values equal those of
    `ops.top_k`; among tied values the order may differ. Used when `k` and
    the last axis are static and the axis is at least `4 * k * chunk` long;
    otherwise it is `ops.top_k`.

    Args:
        x: `(..., n)` float.
        k: Python int.

    Returns: `(values (..., k), indices (..., k) int32)`, values descending.
    """
    n = x.shape[-1]
    if not isinstance(k, int) or n is None or n < 4 * k * chunk:
        return ops.top_k(x, k)
    pad = -n % chunk
    if pad:  # -inf is never chosen: every row has at least k real entries
        x = ops.pad(x, [[0, 0]] * (len(x.shape) - 1) + [[0, pad]],
                    constant_values=float("-inf"))
    lead = leading_axes(x, len(x.shape) - 1)
    chunks = ops.reshape(x, lead + ((n + pad) // chunk, chunk))
    _, best_chunks = ops.top_k(ops.max(chunks, axis=-1), k)
    picked = ops.take_along_axis(chunks, ops.expand_dims(best_chunks, -1), axis=-2)
    values, within = ops.top_k(ops.reshape(picked, lead + (k * chunk,)), k)
    chunk_of = ops.take_along_axis(best_chunks, within // chunk, axis=-1)
    return values, ops.cast(chunk_of * chunk + within % chunk, "int32")


# The first cache length of a search grown in phases (see `cache_phases`).
FIRST_CACHE_PHASE = 8


def cache_phases(max_length, first=FIRST_CACHE_PHASE):
    """Cache lengths for a search of at most `max_length` steps: `first`,
    growing by half (integer), then `max_length` (`[8, 12, 18, 27, 30]` for
    30). A fixed-shape cache sized for the longest possible output costs that
    size at every step (the beam reorder copies it, attention reads it),
    though most searches stop long before the limit (the paper's limit is
    input + 50). Grown in phases, each a fixed-shape loop (XLA compiles one
    per phase), step `t` costs about `max(t, first)` to `1.5 t`. Growing by
    half rather than doubling trades a little search time for more loops to
    compile at long limits (docs/performance.md). A
    `max_length` known only at run time (a tensor) gives one phase.
    """
    if not isinstance(max_length, int):
        return [max_length]
    phases, length = [], first
    while length < max_length:
        phases.append(length)
        length += max(1, length // 2)
    return phases + [max_length]


def resolve_max_length(max_decode_length):
    """At least one step, as an int32 scalar (or a Python int)."""
    if isinstance(max_decode_length, int):
        if max_decode_length <= 0:
            raise ValueError(
                f"`max_decode_length` must be positive, received {max_decode_length}."
            )
        return max_decode_length
    return ops.maximum(ops.cast(max_decode_length, "int32"), 1)
