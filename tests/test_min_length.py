"""The minimum output length: with `min_length=1` (the default of the
model-level searches, the Translator, every SavedModel signature and the
CTranslate2 engine) a non-empty sentence never gets an empty translation,
as with fairseq's `--min-len 1` and CTranslate2's `min_decoding_length`."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_tokenizer import CORPUS

import keras_transformer as kt
from keras_transformer.decoding import beam_search, greedy_search, sampling_search
from keras_transformer.decoding.common import check_min_length, forbid_early_eos
from support.scripted import BOS, EOS, PAD, A, B, MarkovScript, table

# [eos] first has P = 0.5; without eos the first step is A 0.92, B 0.08.
SCRIPT = table({
    BOS: {EOS: 0.5, A: 0.46, B: 0.04},
    A: {EOS: 0.98, A: 0.01, B: 0.01},
    B: {EOS: 0.98, A: 0.01, B: 0.01},
})


def beam(min_length, max_length=8, beam_size=2, compiled=False):
    script = MarkovScript([SCRIPT])

    def search():
        return beam_search(script, np.full((1,), BOS), script.initial_cache([0]), beam_size,
                           0.0, max_length, eos_id=EOS, pad_id=PAD, min_length=min_length)

    out = tf.function(search, jit_compile=True)() if compiled else search()
    return [np.asarray(t) for t in out]


@pytest.mark.parametrize("compiled", [False, True])
def test_beam_search_ends_no_hypothesis_before_min_length(compiled):
    sequences, scores = beam(0, compiled=compiled)
    np.testing.assert_array_equal(sequences[0, :, :2], [[EOS, PAD], [A, EOS]])
    sequences, scores = beam(1, compiled=compiled)
    np.testing.assert_array_equal(sequences[0, :, :3], [[A, EOS, PAD], [B, EOS, PAD]])
    # Eos masked before the softmax: the first step renormalised without it.
    np.testing.assert_allclose(scores[0], np.log([0.92 * 0.98, 0.08 * 0.98]), rtol=1e-4)
    sequences, _ = beam(2, compiled=compiled)
    assert all(list(s).index(EOS) >= 2 for s in sequences[0])


def test_a_limit_at_or_below_min_length_still_ends_with_eos():
    sequences, scores = beam(1, max_length=1, beam_size=1)
    np.testing.assert_array_equal(sequences[0, 0], [EOS])
    np.testing.assert_allclose(scores[0, 0], np.log(0.5), rtol=1e-5)
    sequences, _ = beam(3, max_length=2, beam_size=1)
    np.testing.assert_array_equal(sequences[0, 0], [A, EOS])


def test_greedy_and_sampling_skip_eos_before_min_length():
    script = MarkovScript([SCRIPT])
    args = (script, np.full((1,), BOS), script.initial_cache([0]), 8)
    sequences, scores = greedy_search(*args, eos_id=EOS, pad_id=PAD)
    assert list(np.asarray(sequences)[0, :1]) == [EOS]
    sequences, scores = greedy_search(*args, eos_id=EOS, pad_id=PAD, min_length=1)
    assert list(np.asarray(sequences)[0, :3]) == [A, EOS, PAD]
    np.testing.assert_allclose(np.asarray(scores)[0], np.log(0.92 * 0.98), rtol=1e-4)
    # Whatever the noise, no sample starts with eos.
    noise = np.random.default_rng(0).uniform(size=(64, 8)).astype("float32")
    script = MarkovScript([SCRIPT])
    sequences, _ = sampling_search(
        script, np.full((64,), BOS), script.initial_cache([0] * 64), 8, eos_id=EOS,
        pad_id=PAD, noise=noise, min_length=1)
    assert np.all(np.asarray(sequences)[:, 0] != EOS)
    sequences, _ = sampling_search(
        script, np.full((64,), BOS), script.initial_cache([0] * 64), 8, eos_id=EOS,
        pad_id=PAD, noise=noise, min_length=0)
    assert np.any(np.asarray(sequences)[:, 0] == EOS)  # the check above can fail


def test_forbid_early_eos_is_masking_the_logit_before_the_softmax():
    logits = np.random.default_rng(1).normal(size=(3, 7)).astype("float32")
    log_probs = keras.ops.log_softmax(logits)
    limit = np.array([5, 1, 5], np.int32)
    out = np.asarray(forbid_early_eos(log_probs, 0, 1, limit, eos_id=2))
    masked = logits.copy()
    masked[:, 2] = -np.inf
    expected = np.asarray(keras.ops.log_softmax(masked))
    np.testing.assert_allclose(out[[0, 2]][:, [0, 1, 3, 4, 5, 6]],
                               expected[[0, 2]][:, [0, 1, 3, 4, 5, 6]], rtol=1e-5, atol=1e-6)
    assert np.all(out[[0, 2], 2] <= kt.decoding.large_negative() / 2)
    np.testing.assert_array_equal(out[1], np.asarray(log_probs)[1])  # at its limit
    np.testing.assert_array_equal(np.asarray(forbid_early_eos(log_probs, 1, 1, limit, 2)),
                                  np.asarray(log_probs))  # past min_length
    with pytest.raises(ValueError, match="min_length"):
        beam_search(None, np.zeros((1,)), {}, 1, 0.0, 4, eos_id=EOS, min_length=-1)
    check_min_length(keras.ops.convert_to_tensor(-1))  # a signature checks it in the graph
    for bad in (-1, True, 1.0, "1"):
        with pytest.raises(ValueError, match=r"min_length must be (>= 0|an int32), received"):
            check_min_length(bad, tensor_ok=False)


def eos_loving():
    """A tiny model whose every output position prefers eos (the decoder's
    last norm emits a multiple of eos's embedding row), with its tokenizer.
    One layer: what is checked is the search's, whatever the depth, and
    each engine traces a smaller graph."""
    tok = kt.SubwordTokenizer.train(CORPUS, vocab_size=400)
    model = kt.Transformer(kt.get_config("tiny", tokenizer=tok, max_length=24, dropout=0.0,
                                         num_layers=1))
    model.build()
    table_ = model.weights[0]
    rows = keras.ops.convert_to_numpy(table_).copy()
    rows[tok.eos_id] *= 4.0 / np.linalg.norm(rows[tok.eos_id])
    table_.assign(rows)
    last_norm = [w for w in model.weights
                 if "/decoder/layer_0/feed_forward_block/norm/" in w.path]
    assert sorted(w.path.rsplit("/", 1)[1] for w in last_norm) == ["beta", "gamma"]
    for weight in last_norm:
        weight.assign(np.zeros(weight.shape, "float32") if weight.path.endswith("gamma")
                      else rows[tok.eos_id])
    return model, tok


SOURCES = ["Ein Mann fährt mit dem Fahrrad.", "Die Mädchen überqueren die Straße.", "x", ""]


def test_every_signature_translates_a_non_empty_sentence_to_something(tmp_path):
    model, tok = eos_loving()
    bare = kt.Translator(model, tok, min_length=0)
    assert bare.translate(SOURCES)[0] == [""] * 4  # the model would say nothing
    translator = kt.Translator(model, tok)
    assert translator.min_length == translator.metadata()["min_length"] == 1
    path = kt.export_saved_model(translator, str(tmp_path / "m"))
    loaded = kt.load_saved_model(path)
    for engine in (translator, loaded):
        for texts in (engine.translate(SOURCES)[0],
                      engine.translate(SOURCES, jit_compile=True)[0],
                      engine.translate(SOURCES, beam_size=2, alpha=0.0, extra_length=3)[0],
                      [t for t, _ in [row[0] for row in engine.translate_nbest(SOURCES, n=2)]],
                      [row[1][0] for row in engine.translate_nbest(SOURCES, n=2)],
                      engine.sample(SOURCES, temperature=1.0, seed=5)[0],
                      engine.sample(SOURCES, temperature=0.0)[0],
                      [e["translation"] for e in engine.explain(SOURCES)]):
            assert [t != "" for t in texts] == [True, True, True, False], texts
    assert loaded.metadata["min_length"] == 1
    with pytest.raises(ValueError, match="min_length"):
        kt.Translator(model, tok, min_length=-1)
