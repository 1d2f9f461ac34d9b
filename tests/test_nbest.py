"""n-best lists and sampling options of the Translator's Python API: the
beam size an n-best search uses, clear errors for options that cannot
work, and batching that returns results in the input order. (The lists
themselves, against `beam_search_translate`, `translate` and the
SavedModel: tests/test_export.py.)"""

import pytest
import tensorflow as tf
from test_tokenizer import CORPUS

import keras_transformer as kt
from keras_transformer.export import Translator, nbest_in_batches, translate_in_batches
from keras_transformer.export.option_checks import nbest_beam_size
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece


def test_the_beam_is_at_least_n_unless_given():
    assert nbest_beam_size(3, None, 4) == 4
    assert nbest_beam_size(6, None, 4) == 6
    assert nbest_beam_size(2, 2, 4) == 2
    with pytest.raises(ValueError, match=r"n must be between 1 and 3, received 5"):
        nbest_beam_size(5, 3, 4)
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError,
                           match="n must be (between 1 and beam_size|an int32), received"):
            nbest_beam_size(n, None, 4)


def fake_nbest(batch):
    """A `signature_translate_nbest` stand-in: n = 2 entries `text#k`, scores `-len`."""
    texts = [t.decode() for t in batch.numpy()]
    return {"translations": tf.constant([[f"{t}#{k}" for k in range(2)] for t in texts]),
            "scores": tf.constant([[-float(len(t)) - k for k in range(2)] for t in texts])}


def test_batches_come_back_in_the_input_order():
    sentences = ["ccc", "a", b"bb", "dddd", ""]
    calls = []

    def run(batch):
        calls.append(len(batch))
        return fake_nbest(batch)

    result = nbest_in_batches(run, sentences, batch_size=2)
    assert calls == [2, 2, 1]  # length-sorted batches of 2
    assert result == [[(f"{t}#0", -len(t) - 0.0), (f"{t}#1", -len(t) - 1.0)]
                      for t in ["ccc", "a", "bb", "dddd", ""]]
    translations, scores = translate_in_batches(
        lambda batch: {"translation": batch, "score": -tf.cast(tf.strings.length(batch),
                                                               tf.float32)},
        sentences, batch_size=2)
    assert translations == ["ccc", "a", "bb", "dddd", ""]
    assert scores == [-3.0, -1.0, -2.0, -4.0, -0.0]
    with pytest.raises(ValueError, match="batch_size"):
        nbest_in_batches(fake_nbest, sentences, batch_size=0)


def test_options_that_cannot_work_are_clear_errors_before_any_search():
    tokenizer = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    config = kt.get_config("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0, max_length=20)
    translator = Translator(kt.Transformer(config), tokenizer, beam_size=3)
    with pytest.raises(ValueError, match=r"n must be between 1 and 3, received 4"):
        translator.translate_nbest(["a"], 4, beam_size=3)
    with pytest.raises(ValueError, match="n must be (between 1 and beam_size|an int32), received"):
        translator.translate_nbest(["a"], 0)
    with pytest.raises(ValueError, match=rf"beam_size must be between 1 and "
                       rf"{tokenizer.vocab_size // 2}, received {tokenizer.vocab_size}"):
        translator.translate_nbest(["a"], 2, beam_size=tokenizer.vocab_size)
    for options, name in [(dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                          (dict(temperature=-1.0), "temperature"), (dict(top_k=-2), "top_k"),
                          (dict(seed=2**64), "seed"), (dict(extra_length=-1), "extra_length")]:
        with pytest.raises(ValueError, match=name):
            translator.sample(["a"], **options)
    # None of these traced a search.
    assert translator.signature_translate_nbest.experimental_get_tracing_count() == 0
    assert translator.signature_translate_sample.experimental_get_tracing_count() == 0
