import numpy as np
import pytest

from keras_transformer.decoding import greedy_search
from support.scripted import A, B, BOS, EOS, PAD, MarkovScript, random_tables, table


def test_greedy_follows_the_argmax_and_stops_at_eos():
    tables = [
        table({BOS: {A: 0.6, B: 0.4}, A: {B: 0.7, EOS: 0.3}, B: {EOS: 0.8, A: 0.2}}),
        table({BOS: {EOS: 0.9, A: 0.1}}),
    ]
    script = MarkovScript(tables)
    sequences, scores = greedy_search(
        script, np.full((2,), BOS), script.initial_cache([0, 1]), max_decode_length=6,
        eos_id=EOS, pad_id=PAD,
    )
    np.testing.assert_array_equal(
        sequences, [[A, B, EOS, PAD, PAD, PAD], [EOS, PAD, PAD, PAD, PAD, PAD]]
    )
    np.testing.assert_allclose(
        scores, [np.log(0.6 * 0.7 * 0.8), np.log(0.9)], rtol=1e-5
    )
    assert script.calls == 3  # stops once every sentence has its eos


def test_greedy_truncates_at_the_length_limit():
    script = MarkovScript([table({BOS: {A: 0.9, EOS: 0.1}, A: {A: 0.8, EOS: 0.2}})])
    sequences, scores = greedy_search(
        script, [BOS], script.initial_cache([0]), max_decode_length=4, eos_id=EOS
    )
    np.testing.assert_array_equal(sequences, [[A, A, A, A]])
    np.testing.assert_allclose(scores, [np.log(0.9 * 0.8**3)], rtol=1e-5)


def test_greedy_scores_are_finite_with_masked_logits():
    tables = random_tables(3, 8, seed=3)
    tables[..., 6] = -np.inf  # a token masked out entirely
    script = MarkovScript(tables)
    sequences, scores = greedy_search(
        script, np.full((3,), BOS), script.initial_cache([0, 1, 2]), 10, eos_id=EOS
    )
    assert np.all(np.isfinite(scores))
    assert 6 not in np.asarray(sequences)


def test_rejects_a_non_positive_length():
    script = MarkovScript(random_tables(1, 8, seed=0))
    with pytest.raises(ValueError, match="max_decode_length"):
        greedy_search(script, [BOS], script.initial_cache([0]), 0, eos_id=EOS)
