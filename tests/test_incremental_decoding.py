import numpy as np
import pytest

import keras_transformer as kt
from conftest import random_ids


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
