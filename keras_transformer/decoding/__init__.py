"""Decoding, separate from the model: search strategies driven by a step
function `(ids, step, cache) -> (logits, cache)`, in `keras.ops`."""

from keras_transformer.decoding.beam_search import beam_search, gather_beams, tile_beams
from keras_transformer.decoding.common import large_negative, length_penalty
from keras_transformer.decoding.ensemble import TransformerEnsemble
from keras_transformer.decoding.greedy import greedy_search
from keras_transformer.decoding.sampling import sample_token, sampling_noise, sampling_search
from keras_transformer.decoding.transformer_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    DEFAULT_MIN_LENGTH,
    beam_search_translate,
    decoding_length,
    greedy_translate,
    prepare_decoding,
    sample_translate,
)
