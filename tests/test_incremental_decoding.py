import numpy as np
import pytest

import keras_transformer as kt
from support.common import random_ids


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_steps_equal_the_full_forward_pass(norm_first):
    config = kt.get_config("tiny", vocab_size=40, norm_first=norm_first)
    model = kt.Transformer(config)
    src = random_ids((3, 7))
    src[1, 5:] = config.pad_id
    tgt = random_ids((3, 6), seed=2)
    full = np.asarray(model((src, tgt)))
    memory, memory_mask = model.encode(src)
    cache = model.init_decoding_cache(memory, max_length=9)
    for step in range(tgt.shape[1]):
        logits, cache = model.decode_step(tgt[:, step], step, cache, memory_mask)
        np.testing.assert_allclose(logits, full[:, step], atol=1e-4, err_msg=f"step {step}")
    assert tuple(cache[0]["key"].shape) == (3, 4, 9, 16)


def test_beams_attending_to_their_sentence_as_a_group_equal_tiled_memory():
    # DecoderLayer.decode_step groups each sentence's rows (beams) against
    # the untiled encoder output; with the memory tiled per row the group is
    # one row, the plain computation. Both must agree.
    from keras_transformer.decoding.beam_search import tile_beams

    config = kt.get_config("tiny", vocab_size=40, dropout=0.0)
    model = kt.Transformer(config)
    model.build()
    sentences, beams = 3, 4
    src = random_ids((sentences, 7))
    src[0, -2:] = config.pad_id  # padding, so the memory mask matters
    memory, memory_mask = model.encode(src, training=False)
    cache = model.init_decoding_cache(memory, 5)
    untiled = [dict(c, key=tile_beams(c["key"], beams), value=tile_beams(c["value"], beams))
               for c in cache]
    tiled = [{k: tile_beams(v, beams) for k, v in c.items()} for c in cache]
    ids = random_ids((sentences * beams,))
    grouped, _ = model.decode_step(ids, 0, untiled, memory_mask)
    per_row, _ = model.decode_step(ids, 0, tiled, tile_beams(memory_mask, beams))
    np.testing.assert_allclose(grouped, per_row, rtol=1e-5, atol=1e-5)
