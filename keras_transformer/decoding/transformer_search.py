"""Beam, greedy and sampling search over a `Transformer`'s incremental decoder.

The model side of decoding: encode once, build the fixed-shape cache, and
hand the search a step function. `keras.ops` only.
"""

from keras import ops

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.common import cache_phases
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.sampling import sampling_noise, sampling_search
from keras_transformer.decoding.search_options import OPTIONS
from keras_transformer.ops.shapes import size

# The search defaults, from the options' table (`search_options.OPTIONS`).
DEFAULT_BEAM_SIZE = OPTIONS["beam_size"].default
DEFAULT_ALPHA = OPTIONS["alpha"].default
DEFAULT_EXTRA_LENGTH = OPTIONS["extra_length"].default
DEFAULT_MIN_LENGTH = OPTIONS["min_length"].default


def decoding_length(source_ids, extra_length, max_length, source_length=None):
    """`min(src_len + extra_length, max_length)`: the most target tokens
    (eos included) for a batch of `source_ids` `(batch, src_len)`; the cap
    keeps target positions inside the model's `config.max_length`.
    `source_length` (int, scalar or `(batch,)` tensor) replaces `src_len`:
    per-sentence lengths give per-sentence limits."""
    if isinstance(extra_length, int) and extra_length < 0:
        raise ValueError(f"`extra_length` must be >= 0, received {extra_length}.")
    if source_length is None:
        source_length = size(source_ids, 1)
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

    The cache, which the search tiles, holds only what changes between
    steps: each decoder layer's self-attention `key`/`value` `(batch, heads,
    max_decode_length, depth)`. The step function takes `parents` (see
    `beam_search`'s `reorders_cache`) and reorders the cache as it writes
    it, in one pass. The encoder-decoder keys and values and the source mask
    never change and are the same for every beam of a sentence, so they are
    computed once per sentence and closed over by the step function, untiled:
    the decoder attends to them with each sentence's beams as one group (see
    `DecoderLayer.decode_step`; the group is the number of rows per
    sentence, so one step function serves any beam size).
    """
    memory, memory_mask = model.encode(source_ids, training=False)
    layers = model.init_decoding_cache(memory, max_decode_length)
    cache = [{"key": c["key"], "value": c["value"]} for c in layers]
    constant = [{"memory_key": c["memory_key"], "memory_value": c["memory_value"]}
                for c in layers]

    def symbols_to_logits_fn(ids, step, cache, parents=None):
        full = [dict(c, **k) for c, k in zip(cache, constant)]
        logits, full = model.decode_step(ids, step, full, memory_mask, parents)
        return logits, [{"key": c["key"], "value": c["value"]} for c in full]

    initial_ids = ops.full((size(source_ids, 0),), model.config.bos_id, "int32")
    return initial_ids, cache, symbols_to_logits_fn


def _lengths(model, source_ids, extra_length, source_length):
    """`(max_decode_length, length_limit)`: the batch's longest output and,
    given `source_length`, each sentence's own limit (else None)."""
    max_length = model.config.max_length
    length_limit = None
    if source_length is not None:
        length_limit = decoding_length(source_ids, extra_length, max_length, source_length)
    return decoding_length(source_ids, extra_length, max_length), length_limit


def beam_search_translate(model, source_ids, beam_size=DEFAULT_BEAM_SIZE,
                          alpha=DEFAULT_ALPHA, extra_length=DEFAULT_EXTRA_LENGTH,
                          source_length=None, min_length=DEFAULT_MIN_LENGTH):
    """Beam search with `model`.

    Args:
        model: a built `Transformer`.
        source_ids: `(batch, src_len)` int, padded with `config.pad_id`
            (ending in eos, as the model was trained).
        beam_size, alpha, extra_length: ints/floats or scalar tensors.
        source_length: optional `(batch,)` (or scalar) int tensor: each
            sentence's source length, eos included. Each sentence's output
            limit, `min(source_length + extra_length, config.max_length)`,
            is computed from it, so neither the batch's other sentences nor
            padding to bucketed shapes (XLA) change a translation. Default:
            the width of `source_ids` for every sentence (the limit of Model
            Garden and fairseq).
        min_length: int or scalar int tensor, the fewest tokens before eos
            (see `beam_search`); 1: no empty translation.

    Returns: `(sequences (batch, beam, max_decode_length) int32, scores
    (batch, beam) float32)`, best first (see `beam_search`);
    `max_decode_length` comes from the width of `source_ids`.
    """
    config = model.config
    max_decode_length, length_limit = _lengths(model, source_ids, extra_length, source_length)
    # With static shapes (XLA), the cache grows in phases (`cache_phases`).
    phases = cache_phases(max_decode_length)
    initial_ids, cache, step_fn = prepare_decoding(model, source_ids, phases[0])
    return beam_search(step_fn, initial_ids, cache, beam_size, alpha, max_decode_length,
                       eos_id=config.eos_id, pad_id=config.pad_id,
                       length_limit=length_limit, reorders_cache=True,
                       cache_phases=phases, grow_cache=model.decoder.grow_cache,
                       untiled_first_step=True, min_length=min_length)


def greedy_translate(model, source_ids, extra_length=DEFAULT_EXTRA_LENGTH,
                     min_length=DEFAULT_MIN_LENGTH):
    """Greedy search with `model`: `(sequences (batch, max_decode_length)
    int32, scores (batch,) float32)` (see `greedy_search`), at least
    `min_length` tokens before eos."""
    config = model.config
    max_decode_length = decoding_length(source_ids, extra_length, config.max_length)
    initial_ids, cache, step_fn = prepare_decoding(model, source_ids, max_decode_length)
    return greedy_search(step_fn, initial_ids, cache, max_decode_length,
                         eos_id=config.eos_id, pad_id=config.pad_id, min_length=min_length)


def sample_translate(model, source_ids, temperature=1.0, top_k=0, top_p=1.0, seed=0,
                     extra_length=DEFAULT_EXTRA_LENGTH, source_length=None, noise=None,
                     min_length=DEFAULT_MIN_LENGTH):
    """Sampling search with `model` (see `sampling_search`).

    Args:
        model: a built `Transformer`.
        source_ids: `(batch, src_len)` int, padded with `config.pad_id`
            (ending in eos, as the model was trained).
        temperature, top_k, top_p: Python numbers or scalar tensors (see
            `sampling_search`); `temperature=0` is `greedy_translate`.
        seed: an int (or `keras.random.SeedGenerator`) for
            `sampling_noise(batch, max_decode_length, seed)`, used when
            `noise` is None: the same int gives the same samples for the
            same batch (a sentence's uniforms depend on its row).
        extra_length: int or scalar tensor.
        source_length: optional `(batch,)` (or scalar) int tensor, each
            sentence's source length (eos included), for per-sentence
            output limits `min(source_length + extra_length,
            config.max_length)`, as in `beam_search_translate`. Default: the
            width of `source_ids` for every sentence.
        noise: optional `(batch, width)` uniforms in `[0, 1)`, `width >=
            max_decode_length` (at most `config.max_length` is ever needed):
            the caller's randomness, used instead of `seed`.
        min_length: the fewest tokens before eos (see `sampling_search`).

    Returns: `(sequences (batch, max_decode_length) int32, scores (batch,)
    float32)`, the scores the model's untempered log-probabilities of the
    sampled tokens, summed; `max_decode_length` comes from the width of
    `source_ids`.
    """
    config = model.config
    max_decode_length, length_limit = _lengths(model, source_ids, extra_length, source_length)
    initial_ids, cache, step_fn = prepare_decoding(model, source_ids, max_decode_length)
    if noise is None:
        noise = sampling_noise(size(source_ids, 0), max_decode_length, seed)
    return sampling_search(step_fn, initial_ids, cache, max_decode_length,
                           eos_id=config.eos_id, pad_id=config.pad_id,
                           temperature=temperature, top_k=top_k, top_p=top_p, noise=noise,
                           length_limit=length_limit, min_length=min_length)
