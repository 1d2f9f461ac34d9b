"""Sampling search (keras_transformer/decoding/sampling.py) on scripted
language models: reproducible for a seed, greedy at temperature 0, the
right tokens kept by top-k and top-p, the right distribution."""

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import decoding
from keras_transformer.decoding import greedy_search, sample_token, sampling_search
from support.common import random_ids
from support.scripted import (
    A, B, BOS, EOS, PAD, UNK, MarkovScript, PrefixScript, random_prefix_tables, table,
)

# One step from BOS: P(eos) = 0.5, P(a) = 0.3, P(b) = 0.15, P(unk) = 0.05.
FIRST_STEP = table({BOS: {EOS: 0.5, A: 0.3, B: 0.15, UNK: 0.05}})


def sample(script, sentences, max_length, **options):
    return [np.asarray(t) for t in sampling_search(
        script, np.full((len(sentences),), BOS), script.initial_cache(sentences), max_length,
        eos_id=EOS, pad_id=PAD, **options)]


def greedy(tables, sentences, max_length):
    script = PrefixScript(tables)
    return [np.asarray(t) for t in greedy_search(
        script, np.full((len(sentences),), BOS), script.initial_cache(sentences), max_length,
        eos_id=EOS, pad_id=PAD)]


def first_tokens(rows, **options):
    """The first sampled token of `rows` sentences from `FIRST_STEP`."""
    sequences, _ = sample(MarkovScript([FIRST_STEP]), [0] * rows, 1, **options)
    return sequences[:, 0]


def test_the_same_seed_gives_the_same_samples_and_another_seed_others():
    # Two equally likely tokens for 24 steps: two seeds agreeing on all
    # 8 x 24 draws would be a 2**-192 coincidence.
    coin = table({BOS: {A: 0.5, B: 0.5}, A: {A: 0.5, B: 0.5}, B: {A: 0.5, B: 0.5}})
    runs = [sample(MarkovScript([coin]), [0] * 8, 24, seed=seed) for seed in (7, 7, 8)]
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert not np.array_equal(runs[0][0], runs[2][0])
    # Explicit noise is the same as the seed it was drawn with.
    noise = decoding.sampling_noise(8, 24, seed=7)
    np.testing.assert_array_equal(sample(MarkovScript([coin]), [0] * 8, 24, noise=noise)[0],
                                  runs[0][0])


@pytest.mark.parametrize("options", [
    dict(temperature=0.0),
    dict(temperature=1e-4, seed=3),
    dict(temperature=1.0, top_k=1, seed=3),
    dict(temperature=1.0, top_p=1e-6, seed=3),
], ids=["temperature-0", "temperature-1e-4", "top-k-1", "tiny-top-p"])
def test_greedy_limits_of_sampling_are_greedy_search(options):
    tables = random_prefix_tables(6, 10, seed=11, eos_bias=0.5)
    sentences = list(range(6))
    expected = greedy(tables, sentences, 12)
    sequences, scores = sample(PrefixScript(tables), sentences, 12, **options)
    np.testing.assert_array_equal(sequences, expected[0])
    np.testing.assert_allclose(scores, expected[1], rtol=1e-6)
    # A plain temperature-1 sample of these tables is not greedy, so the
    # cases above are not equal by accident.
    assert not np.array_equal(sample(PrefixScript(tables), sentences, 12, seed=3)[0],
                              expected[0])


def test_scores_are_the_models_untempered_log_probabilities():
    tables = random_prefix_tables(4, 10, seed=12, eos_bias=0.5)
    script = PrefixScript(tables)
    sequences, scores = sample(script, [0, 1, 2, 3], 10, temperature=2.0, top_k=4, seed=5)
    for b in range(4):
        tokens = list(sequences[b])
        length = tokens.index(EOS) + 1 if EOS in tokens else len(tokens)
        assert all(t == PAD for t in tokens[length:])
        np.testing.assert_allclose(scores[b], script.log_prob(b, tokens[:length]), rtol=1e-5)


def test_inverse_cdf_over_the_filtered_renormalised_distribution():
    log_probs = np.repeat(FIRST_STEP[BOS][None], 4, axis=0)
    # top_p = 0.75 keeps eos and a (0.5 + 0.3 reach it), renormalised to
    # 0.625 and 0.375: the uniforms pick by that cumulative distribution.
    uniforms = np.array([0.0, 0.62, 0.63, 0.999], "float32")
    np.testing.assert_array_equal(sample_token(log_probs, uniforms, top_p=0.75),
                                  [EOS, EOS, A, A])
    # top_k = 3: eos, a, b (0.5, 0.3, 0.15) / 0.95.
    uniforms = np.array([0.52, 0.53, 0.84, 0.85], "float32")
    np.testing.assert_array_equal(sample_token(log_probs, uniforms, top_k=3), [EOS, A, A, B])
    # No cut: the inverse CDF in rank order (eos 0.5, a 0.3, b 0.15, unk 0.05).
    uniforms = np.array([0.49, 0.51, 0.94, 0.96], "float32")
    np.testing.assert_array_equal(sample_token(log_probs, uniforms), [EOS, A, B, UNK])


@pytest.mark.parametrize("options, kept", [
    (dict(top_p=0.75), {EOS, A}),
    (dict(top_p=0.85), {EOS, A, B}),
    (dict(top_k=2), {EOS, A}),
    # top-p over the top-k renormalised: eos + a are 0.842 of the top 3's
    # mass (0.8 of the whole), so 0.83 cuts b and 0.9 keeps it.
    (dict(top_k=3, top_p=0.83), {EOS, A}),
    (dict(top_k=3, top_p=0.9), {EOS, A, B}),
    (dict(top_p=1.0), {EOS, A, B, UNK}),
])
def test_top_k_and_top_p_keep_the_right_tokens(options, kept):
    tokens = first_tokens(4000, seed=21, **options)
    assert set(tokens.tolist()) == kept
    # Each kept token with its renormalised probability.
    probs = np.exp(FIRST_STEP[BOS].astype("float64"))
    expected = {t: probs[t] / sum(probs[k] for k in kept) for t in kept}
    for token, p in expected.items():
        assert abs(np.mean(tokens == token) - p) < 0.03


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_the_empirical_distribution_is_the_tempered_one(temperature):
    # Three tokens, 20000 draws with a fixed seed: each frequency's standard
    # deviation is at most 0.0036, so a bound of 0.015 is over 4 of them.
    three = table({BOS: {EOS: 0.2, A: 0.5, B: 0.3}})
    sequences, _ = sample(MarkovScript([three]), [0] * 20000, 1, temperature=temperature,
                          seed=2024)
    p = np.array([0.2, 0.5, 0.3]) ** (1.0 / temperature)
    p /= p.sum()
    counts = np.array([np.mean(sequences[:, 0] == t) for t in (EOS, A, B)])
    assert counts.sum() > 0.999  # the floor tokens (1e-9) are practically never drawn
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_length_limits_and_eos_end_a_sample():
    tables = random_prefix_tables(3, 10, seed=13, eos_bias=-2.0)
    sequences, _ = sample(PrefixScript(tables), [0, 1, 2], 8, seed=1,
                          length_limit=np.array([2, 8, 5], "int32"))
    for row, limit in zip(sequences, [2, 8, 5]):
        tokens = list(row)
        end = tokens.index(EOS) + 1 if EOS in tokens else limit
        assert end <= limit
        assert all(t == PAD for t in tokens[end:])
        assert all(t != PAD for t in tokens[:end])


def test_runs_compiled_with_xla_and_with_tensor_options():
    tables = random_prefix_tables(3, 10, seed=14, eos_bias=0.5)
    script = PrefixScript(tables)
    noise = np.asarray(decoding.sampling_noise(3, 9, seed=4))
    expected = sample(PrefixScript(tables), [0, 1, 2], 9, temperature=0.7, top_k=5,
                      top_p=0.9, noise=noise)

    @tf.function(jit_compile=True)
    def compiled():
        return sampling_search(script, tf.fill([3], BOS), script.initial_cache([0, 1, 2]), 9,
                               eos_id=EOS, temperature=0.7, top_k=5, top_p=0.9, noise=noise)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
                                  tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)])
    def dynamic(temperature, top_k, top_p, max_length):
        return sampling_search(script, tf.fill([3], BOS), script.initial_cache([0, 1, 2]),
                               max_length, eos_id=EOS, temperature=temperature, top_k=top_k,
                               top_p=top_p, noise=noise)

    for sequences, scores in (compiled(), dynamic(0.7, 5, 0.9, 9)):
        np.testing.assert_array_equal(sequences, expected[0])
        np.testing.assert_allclose(scores, expected[1], rtol=1e-5)
    # Tensor options at their "off" values and temperature 0 (greedy).
    greedy_sequences, greedy_scores = greedy(tables, [0, 1, 2], 9)
    sequences, scores = dynamic(0.0, 0, 1.0, 9)
    np.testing.assert_array_equal(sequences, greedy_sequences)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)
    unfiltered = sample(PrefixScript(tables), [0, 1, 2], 9, noise=noise)
    np.testing.assert_array_equal(dynamic(1.0, 0, 1.0, 9)[0], unfiltered[0])


def test_rejects_bad_options():
    script = MarkovScript([FIRST_STEP])
    for options, name in [(dict(temperature=-0.1), "temperature"), (dict(top_k=-1), "top_k"),
                          (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p")]:
        with pytest.raises(ValueError, match=name):
            sample(script, [0], 3, **options)


def test_sample_translate_with_the_model():
    config = kt.get_config("tiny", vocab_size=40, dropout=0.0, max_length=32)
    model = kt.Transformer(config)
    model.build()
    src = random_ids((3, 6), high=40)
    src[:, -1] = config.eos_id
    greedy_sequences, greedy_scores = decoding.greedy_translate(model, src, extra_length=4)
    sequences, scores = decoding.sample_translate(model, src, temperature=0.0, extra_length=4)
    np.testing.assert_array_equal(sequences, greedy_sequences)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-5)
    # A seed reproduces a sample; per-sentence limits cut it.
    first = decoding.sample_translate(model, src, seed=9, extra_length=4,
                                      source_length=np.array([1, 6, 3], "int32"))
    second = decoding.sample_translate(model, src, seed=9, extra_length=4,
                                       source_length=np.array([1, 6, 3], "int32"))
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    assert np.all(np.asarray(first[1]) < 0)
    for row, limit in zip(np.asarray(first[0]), [5, 10, 7]):
        assert np.all(row[limit:] == config.pad_id)
