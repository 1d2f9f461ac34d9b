"""Batched beam search with a length penalty, knowing nothing of the model.

Written with `keras.ops` and fixed-shape loop state (`ops.while_loop`), so it
runs on any backend, inside a `tf.function`, and under XLA. With TensorFlow,
`beam_size`, `alpha` and `max_decode_length` may be tensors (an exported
model takes them as inputs).

The algorithm (after T2T, Model Garden's `ops/beam_search.py` and fairseq):

- The search space is every sequence that ends in eos and has at most
  `limit` tokens, eos included (`length_limit`, per sentence, default
  `max_decode_length`): the space an exhaustive search would rank. Each
  hypothesis is scored with the GNMT length penalty, `log P / ((5 + length)
  / 6) ** alpha`, `log P` including the eos.
- Two sets per sentence, `beam_size` each: *alive* hypotheses, still being
  extended, and *finished* ones, which end in eos.
- Each step extends every alive hypothesis by every token and keeps the
  `2 * beam_size` best candidates by log-probability. Those among them that
  end in eos join the finished set, which keeps the best `beam_size` by
  score (as in T2T and Model Garden: keeping a finished hypothesis costs
  nothing, and the set only improves; fairseq takes only those ranked in
  the top `beam_size`, which makes beam 1 greedy search but misses the
  best hypothesis more often, see docs/decoding-and-serving.md). The best
  `beam_size` that do not end in eos stay alive (there are always enough,
  since each hypothesis contributes at most one eos candidate). So beam
  search with `beam_size=1` is not greedy search: it returns the greedy
  path's hypothesis or a better one, found when eos ranked second.
- At a sentence's limit eos is forced, as in fairseq: the step that writes
  the last allowed position offers eos alone, charged its log-probability,
  so every alive hypothesis finishes there as a hypothesis of `limit`
  tokens whose last is eos. (A hypothesis cut at the limit without eos,
  scored without the eos's cost, could outrank every finished one.) Limits
  per sentence keep a translation independent of the batch it was decoded
  in.
- A sentence is done when its finished set is full and its worst finished
  score is at least the best score any alive hypothesis could still reach
  (its log-probability can only fall; the penalty is monotonic in the
  length, so the bound is taken at the shortest or the longest length still
  possible), or when it reaches its limit. The loop stops when every
  sentence is done.
- A candidate whose log-probability is below `large_negative() / 2` holds
  a token the model masked (`-inf` logits, floored to `large_negative()`)
  or continues a placeholder beam, and never joins the finished set; when
  fewer than `beam_size` hypotheses exist (a limit of 1: `[eos]` alone),
  the remaining slots stay empty.
"""

import keras
from keras import ops

from keras_transformer.decoding.common import (
    SCORE_DTYPE,
    check_min_length,
    forbid_early_eos,
    large_negative,
    length_penalty,
    log_softmax,
    resolve_max_length,
    top_k,
    write_position,
)
from keras_transformer.ops.shapes import leading_axes, size

NEG = large_negative(SCORE_DTYPE)


def tile_beams(x, beam_size):
    """`(batch, ...)` -> `(batch * beam_size, ...)`, each row repeated
    `beam_size` times in place (row `b * beam_size + k` is beam `k` of
    sentence `b`)."""
    return ops.repeat(x, beam_size, axis=0)


def gather_beams(x, beam_indices):
    """Picks beams per sentence.

    Args:
        x: `(batch, beams_in, ...)`.
        beam_indices: `(batch, beams_out)` int, indices into axis 1 of `x`.

    Returns: `(batch, beams_out, ...)`.
    """
    flat_indices = _flat_beam_indices(beam_indices, size(x, 1))
    tail = tuple(size(x, axis) for axis in range(2, len(x.shape)))
    out = ops.take(ops.reshape(x, (-1,) + tail), ops.reshape(flat_indices, (-1,)), axis=0)
    return ops.reshape(out, leading_axes(beam_indices, 2) + tail)


def _flat_beam_indices(beam_indices, beams_in):
    """Row indices into the flattened `(batch * beams_in, ...)` tensor."""
    batch_size = size(beam_indices, 0)
    offsets = ops.expand_dims(ops.arange(batch_size, dtype="int32") * beams_in, 1)
    return ops.cast(beam_indices, "int32") + offsets


def beam_search(symbols_to_logits_fn, initial_ids, initial_cache, beam_size, alpha,
                max_decode_length, eos_id, pad_id=0, length_limit=None,
                reorders_cache=False, cache_phases=None, grow_cache=None,
                untiled_first_step=False, min_length=0):
    """Batched beam search.

    Args:
        symbols_to_logits_fn: `(ids (batch * beam,), step, cache) -> (logits
            (batch * beam, vocab), cache)`: `ids` is the token at position
            `step` of each hypothesis (the start token at step 0), `step` a
            scalar int32, `cache` a nested structure of tensors with
            `batch * beam` as axis 0 (row `b * beam + k` is beam `k` of
            sentence `b`); the search reorders the cache with a gather on
            axis 0 as beams are selected.
        initial_ids: `(batch,)` int, the start token of each sentence.
        initial_cache: nested structure of tensors with `batch` as axis 0;
            tiled here to `batch * beam`.
        beam_size: int (or scalar int tensor with TensorFlow) >= 1. The
            vocabulary must have at least `2 * beam_size` entries.
        alpha: the length-penalty exponent (0: no penalty; the paper: 0.6).
        max_decode_length: int or scalar int tensor, the most tokens to
            generate (eos included).
        eos_id: the end-of-sentence id.
        pad_id: written after a hypothesis's eos.
        length_limit: optional int, scalar or `(batch,)` int tensor (values
            above `max_decode_length` count as `max_decode_length`): the
            most tokens to generate, eos included, per sentence if a vector;
            at its limit a hypothesis can only end, with eos. The width of
            the output fixes shapes (under XLA it must be known at compile
            time); the limits need not be, so one compiled search serves
            every limit up to the width, and a sentence's limit can follow
            its own length rather than its batch's. Default:
            `max_decode_length`.
        reorders_cache: if True, the search does not gather the cache when
            it selects beams; instead `symbols_to_logits_fn(ids, step, cache,
            parents)` gets `parents` `(batch * beam,)` int32, meaning row
            `i` continues the hypothesis in row `parents[i]` of `cache`, and
            returns its new cache in the order of `ids`. A step that writes
            its cache anyway can then reorder and write in one pass (see
            `layers/decoder.py`, `write_cache`).
        cache_phases: optional increasing Python ints ending at
            `max_decode_length` (see `common.cache_phases`): the search runs
            steps `0 .. cache_phases[0] - 1` with `initial_cache` (which
            must hold that many steps), then calls `grow_cache(cache,
            cache_phases[1])` and goes on, and so on. Results do not depend
            on the phases.
        grow_cache: `(cache, length) -> cache` with room for `length` steps;
            needed with more than one phase.
        untiled_first_step: if True, step 0 calls `symbols_to_logits_fn`
            once per sentence, on `initial_ids` and the untiled
            `initial_cache` (`batch` rows, `parents` the identity), and
            tiles its logits and cache: before step 0 a sentence's beams are
            identical, so this is the same search for `1 / beam_size` of the
            first step's work. The step function must then accept any
            number of rows per sentence.
        min_length: int or scalar int tensor: no hypothesis ends before
            this many tokens that are not eos (eos is never a candidate
            earlier; the other tokens' log-probabilities are renormalised
            there, `common.forbid_early_eos`), unless its sentence's limit
            leaves no room (a limit of at most `min_length` still ends
            with the forced eos). 0: eos may come first (an empty output).
            The model-level searches (`beam_search_translate`) default to
            1, as fairseq and CTranslate2.

    Returns:
        `(sequences (batch, beam, max_decode_length) int32, scores (batch,
        beam) float32)`, best first. A sequence is the generated tokens,
        ending with eos, then `pad_id`: a hypothesis that reaches its
        sentence's limit ends there with an eos the search forced (its
        other tokens are the hypothesis cut one token before the limit).
        Its score is `log P / ((5 + length) / 6) ** alpha`, `log P` the sum
        of the log-probabilities of all its tokens, the eos's included
        (also a forced one's), `length` their number (eos included), so
        every score ranks the same space of eos-ended sequences and is
        finite. A slot for which no hypothesis exists (fewer than `beam`
        sequences fit the limit) holds `pad_id` only and scores
        `large_negative()`.
    """
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"`beam_size` must be at least 1, received {beam_size}.")
    check_min_length(min_length)
    max_length = resolve_max_length(max_decode_length)
    phases = _checked_phases(cache_phases, max_length, grow_cache)
    initial_ids = ops.cast(initial_ids, "int32")
    batch_size = size(initial_ids, 0)
    # `max_length` sizes the buffers; `limit` `(batch,)` is where each
    # sentence's hypotheses stop.
    limit = max_length if length_limit is None else ops.minimum(
        resolve_max_length(length_limit), max_length)
    limit = ops.broadcast_to(ops.cast(limit, "int32"), (batch_size,))
    last_step = ops.max(limit)
    beam = beam_size
    first_beam = ops.expand_dims(ops.equal(ops.arange(beam), 0), 0)
    state = {
        "step": ops.convert_to_tensor(0, "int32"),
        # Alive hypotheses: only beam 0 is real at the start, the others are
        # "impossible" copies so the first step does not pick duplicates.
        "alive_sequences": ops.full((batch_size, beam, max_length), pad_id, "int32"),
        "alive_log_probs": ops.where(
            first_beam, 0.0, ops.full((batch_size, beam), NEG, SCORE_DTYPE)
        ),
        "alive_last_ids": ops.repeat(ops.expand_dims(initial_ids, 1), beam, axis=1),
        "alive_cache": None if untiled_first_step else keras.tree.map_structure(
            lambda x: tile_beams(x, beam), initial_cache
        ),
        # With `reorders_cache`, the cache rows each hypothesis continues.
        "alive_parents": ops.arange(batch_size * beam, dtype="int32"),
        "finished_sequences": ops.full((batch_size, beam, max_length), pad_id, "int32"),
        "finished_scores": ops.full((batch_size, beam), NEG, SCORE_DTYPE),
        "finished_flags": ops.zeros((batch_size, beam), "bool"),
        "done": ops.zeros((batch_size,), "bool"),
    }

    def best_reachable_score(alive_log_probs, step):
        """Upper bound `(batch,)` on the final score of any alive hypothesis
        after `step + 1` tokens have been generated."""
        best = ops.max(alive_log_probs, axis=1)
        shortest = ops.minimum(step + 2, limit)  # (batch,)
        return ops.maximum(
            best / length_penalty(shortest, alpha), best / length_penalty(limit, alpha)
        )

    def cond(state):
        return ops.logical_and(
            ops.less(state["step"], last_step),
            ops.logical_not(ops.all(state["done"])),
        )

    def extend(ids, step, cache, parents):
        """The model's step: `(log_probs float32, cache)`; `parents` goes
        to the step function only when it reorders its own cache."""
        args = (ids, step, cache) + ((parents,) if reorders_cache else ())
        logits, cache = symbols_to_logits_fn(*args)
        return log_softmax(logits), cache

    def body(state):
        ids = ops.reshape(state["alive_last_ids"], (-1,))
        return select(state, *extend(ids, state["step"], state["alive_cache"],
                                     state["alive_parents"]))

    def select(state, log_probs, cache):
        """The search's step after the model's: `log_probs` `(batch * beam,
        vocab)` float32 and `cache` extend the alive hypotheses of
        `state`; returns the next state."""
        step = state["step"]
        vocab_size = size(log_probs, -1)
        log_probs = forbid_early_eos(ops.reshape(log_probs, (batch_size, beam, vocab_size)),
                                     step, min_length, limit, eos_id)
        # At a sentence's limit only eos may follow, at its own cost.
        at_limit = ops.reshape(ops.equal(step + 1, limit), (-1, 1, 1))
        not_eos = ops.reshape(ops.not_equal(ops.arange(vocab_size), eos_id), (1, 1, -1))
        log_probs = ops.where(ops.logical_and(at_limit, not_eos), NEG, log_probs)

        # 2 * beam candidates by total log-probability. (A static width
        # lets `top_k` take its fast path.)
        total = ops.expand_dims(state["alive_log_probs"], 2) + log_probs
        width = beam * vocab_size
        candidate_log_probs, flat_ids = top_k(
            ops.reshape(total, (-1, width) if isinstance(width, int) else (batch_size, -1)),
            2 * beam,
        )
        candidate_beams = ops.cast(flat_ids // vocab_size, "int32")
        candidate_tokens = ops.cast(flat_ids % vocab_size, "int32")
        candidate_sequences = write_position(
            gather_beams(state["alive_sequences"], candidate_beams), candidate_tokens, step
        )
        is_eos = ops.equal(candidate_tokens, eos_id)

        # The best `beam` candidates without eos stay alive.
        alive_scores, alive_picks = ops.top_k(
            ops.where(is_eos, NEG, candidate_log_probs), beam
        )
        alive_parents = ops.take_along_axis(candidate_beams, alive_picks, axis=1)
        flat_parents = ops.reshape(_flat_beam_indices(alive_parents, beam), (-1,))
        new_state = {
            "step": step + 1,
            "alive_sequences": gather_beams(candidate_sequences, alive_picks),
            "alive_log_probs": alive_scores,
            "alive_last_ids": ops.take_along_axis(candidate_tokens, alive_picks, axis=1),
            "alive_cache": cache if reorders_cache else keras.tree.map_structure(
                lambda x: ops.take(x, flat_parents, axis=0), cache
            ),
            "alive_parents": flat_parents,
        }

        # Every possible candidate that ends in eos joins the finished set;
        # keep its best `beam`. A sentence past its limit (others in the
        # batch still run) takes no more.
        within = ops.expand_dims(ops.less_equal(step + 1, limit), 1)
        possible = ops.greater(candidate_log_probs, NEG / 2)
        finishing = ops.logical_and(within, ops.logical_and(is_eos, possible))
        finishing_scores = ops.where(
            finishing, candidate_log_probs / length_penalty(step + 1, alpha), NEG
        )
        merged_scores = ops.concatenate([state["finished_scores"], finishing_scores], axis=1)
        finished_scores, finished_picks = ops.top_k(merged_scores, beam)
        merged_flags = ops.concatenate([state["finished_flags"], finishing], axis=1)
        new_state["finished_scores"] = finished_scores
        new_state["finished_flags"] = ops.take_along_axis(merged_flags, finished_picks, axis=1)
        new_state["finished_sequences"] = gather_beams(
            ops.concatenate([state["finished_sequences"], candidate_sequences], axis=1),
            finished_picks,
        )
        worst_finished = ops.min(
            ops.where(new_state["finished_flags"], finished_scores, NEG), axis=1
        )
        new_state["done"] = ops.logical_or(
            ops.logical_and(
                ops.all(new_state["finished_flags"], axis=1),
                ops.greater_equal(worst_finished, best_reachable_score(alive_scores, step)),
            ),
            ops.greater_equal(step + 1, limit),
        )
        return new_state

    if untiled_first_step:
        # Step 0 once per sentence (see the docstring), tiled to the beams.
        log_probs, cache = extend(initial_ids, state["step"], initial_cache,
                                  ops.arange(batch_size, dtype="int32"))
        state = select(state, tile_beams(log_probs, beam),
                       keras.tree.map_structure(lambda x: tile_beams(x, beam), cache))
    for i, length in enumerate(phases):
        if i:
            state["alive_cache"] = grow_cache(state["alive_cache"], length)
        state = ops.while_loop(
            lambda state, length=length: ops.logical_and(
                cond(state), ops.less(state["step"], length)),
            body, state)
    # Empty slots (see the docstring) hold pad whichever placeholder filled them.
    sequences = ops.where(ops.expand_dims(state["finished_flags"], 2),
                          state["finished_sequences"], pad_id)
    return sequences, state["finished_scores"]


def _checked_phases(cache_phases, max_length, grow_cache):
    """`cache_phases` validated: Python ints that increase, the last (which
    may be a tensor when `max_length` is) equal to `max_length`."""
    if cache_phases is None:
        return [max_length]
    phases = list(cache_phases)
    fixed = phases[:-1] + ([phases[-1]] if isinstance(phases[-1], int) else [])
    if not phases or not all(isinstance(p, int) and p >= 1 for p in fixed) or any(
            b <= a for a, b in zip(fixed, fixed[1:])):
        raise ValueError(f"`cache_phases` must be increasing positive ints, received {phases}.")
    if isinstance(max_length, int) and phases[-1] != max_length:
        raise ValueError(f"`cache_phases` must end at max_decode_length ({max_length}), "
                         f"received {phases}.")
    if len(phases) > 1 and grow_cache is None:
        raise ValueError("`grow_cache` is needed with more than one cache phase.")
    return phases
