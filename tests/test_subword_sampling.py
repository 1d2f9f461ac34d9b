"""Subword regularization (`--subword-sampling`): the candidates are the
text's segmentations, best first; draws follow P ** alpha, each side on its
own; kt-train passes the setting to the training stream only, and refuses a
BPE vocabulary naming the flag. Exact resume with sampling is in
test_batching.py."""

import argparse
import os

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer.data.subword_sampling import (
    SubwordSampling, check_unigram, nbest_segmentations, sampled_pairs)
from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

CORPUS = [
    "a man rides his bike across the bridge .",
    "two dogs are playing in the snow while it snows .",
    "the girls cross the street near the market .",
    "an old woman sells red apples at the market .",
    "three children run after a big blue ball .",
    "ein Mann fährt mit seinem Fahrrad über die Brücke .",
    "zwei Hunde spielen im Schnee , während es schneit .",
] * 20
TEXT = "the children are playing with their dogs near the bridge ."


@pytest.fixture
def tokenizer():
    return SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))


def test_candidates_are_the_distinct_segmentations_of_the_text_best_first(tokenizer):
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    texts = [TEXT, "", "Straße → café ☃", "a"]
    ids, log_probs = nbest_segmentations(tokenizer.model_proto, texts, 8)
    assert ids.dtype == tf.int32 and log_probs.dtype == tf.float32
    best = tokenizer.tokenize(tf.constant(texts))
    for i, text in enumerate(texts):
        candidates = [list(c) for c in ids[i].to_list()]
        scores = log_probs[i].numpy()
        assert len(candidates) == len(scores) <= 8
        assert len({tuple(c) for c in candidates}) == len(candidates)
        assert all(processor.decode(c) == text for c in candidates)
        assert candidates[0] == best[i].numpy().tolist()  # the tokenizer's segmentation
        # Our scores rank the candidates as SentencePiece's search did.
        assert np.all(np.diff(scores) <= 1e-5), scores
    assert len(ids[0].to_list()) == 8  # a sentence has many segmentations
    assert ids[1].to_list() == [[]]  # the empty text has one, the empty one


def _draws(tokenizer, alpha, rounds, text=TEXT, seed=5):
    pairs = tf.data.Dataset.from_tensor_slices(([text], [text]))
    stream = sampled_pairs(pairs, SubwordSampling(alpha, 8), tokenizer, tokenizer, seed,
                           lambda d: d.repeat(rounds))
    return [tuple(x.numpy().tolist() for x in element) for element in stream]


def test_draws_follow_p_to_the_alpha_each_side_on_its_own(tokenizer):
    ids, log_probs = nbest_segmentations(tokenizer.model_proto, [TEXT], 8)
    candidates = [tuple(c) for c in ids[0].to_list()]
    scores = log_probs[0].numpy().astype(np.float64)
    rounds = 3000
    expected = {}
    for alpha in (0.2, 1.0):
        p = np.exp(alpha * (scores - scores.max()))
        p /= p.sum()
        expected[alpha] = p
        draws = _draws(tokenizer, alpha, rounds)
        eos, bos = tokenizer.eos_id, tokenizer.bos_id
        source_index, target_index = [], []
        for source, target_in, target_out in draws:
            assert source[-1] == eos and target_in[0] == bos and target_out[-1] == eos
            assert target_in[1:] == target_out[:-1]
            source_index.append(candidates.index(tuple(source[:-1])))
            target_index.append(candidates.index(tuple(target_out[:-1])))
        for index in (source_index, target_index):
            seen = np.bincount(index, minlength=len(p)) / rounds
            # 5 standard deviations of a binomial frequency, and float rounding.
            bound = 5 * np.sqrt(p * (1 - p) / rounds) + 1e-3
            assert np.all(np.abs(seen - p) <= bound), (alpha, seen, p)
        # The sides draw independently: they agree as often as two
        # independent draws would (one shared draw would always agree).
        agree = np.mean(np.array(source_index) == np.array(target_index))
        same = float((p ** 2).sum())
        assert abs(agree - same) <= 5 * np.sqrt(same * (1 - same) / rounds) + 1e-3
    # The two alphas are told apart: the test can see alpha ignored.
    assert np.max(np.abs(expected[0.2] - expected[1.0])) > 0.1


def test_a_large_alpha_keeps_the_tokenizers_segmentation(tokenizer):
    best = tokenizer.tokenize(tf.constant([TEXT]))[0].numpy().tolist()
    for source, _, target_out in _draws(tokenizer, 1e4, 50):
        assert source[:-1] == best and target_out[:-1] == best


def test_the_draws_depend_on_the_seed_only(tokenizer):
    first = _draws(tokenizer, 0.2, 40, seed=3)
    assert first == _draws(tokenizer, 0.2, 40, seed=3)
    assert first != _draws(tokenizer, 0.2, 40, seed=4)
    assert len({str(d) for d in first}) > 5  # draws differ from round to round


@pytest.mark.parametrize("alpha, nbest, message", [
    (0, 8, "`alpha` must be a positive number"),
    (-0.5, 8, "`alpha` must be a positive number"),
    (float("nan"), 8, "`alpha` must be a positive number"),
    (float("inf"), 8, "`alpha` must be a positive number"),
    ("0.2", 8, "`alpha` must be a positive number"),
    (0.2, 1, "`nbest` must be an int >= 2"),
    (0.2, 2.0, "`nbest` must be an int >= 2"),
    (0.2, True, "`nbest` must be an int >= 2"),
])
def test_settings_are_checked(alpha, nbest, message):
    with pytest.raises(ValueError, match=message):
        SubwordSampling(alpha, nbest)


def test_a_bpe_vocabulary_is_refused_naming_the_flag():
    from keras_transformer.pipeline.settings import DEFAULT_SUBWORD_NBEST
    from keras_transformer.pipeline.vocabulary import subword_sampling

    bpe = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400, model_type="bpe"))
    with pytest.raises(ValueError, match="needs a unigram SentencePiece vocabulary"):
        check_unigram(bpe.model_proto)
    args = argparse.Namespace(subword_sampling=0.2, subword_nbest=None)
    with pytest.raises(ValueError, match=r"^--subword-sampling: .*not unigram"):
        subword_sampling(args, bpe, bpe)
    unigram = SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))
    with pytest.raises(ValueError, match=r"^--subword-sampling: "):  # either side
        subword_sampling(args, unigram, bpe)
    assert subword_sampling(args, unigram, unigram) == SubwordSampling(
        0.2, DEFAULT_SUBWORD_NBEST)
    args.subword_sampling = None
    assert subword_sampling(args, bpe, bpe) is None


def test_kt_train_samples_the_training_stream_only(tmp_path, monkeypatch, capsys):
    """A tiny kt-train run with --subword-sampling: the training batches get
    the setting, validation keeps the tokenizer's segmentation, the run
    records it; with a BPE vocabulary it stops with status 2 naming the flag."""
    from keras_transformer.cli import train as trainer

    from support.common import record_token_batches
    from support.processes import write_corpus

    data = tmp_path / "data"
    data.mkdir()
    write_corpus(str(data))
    calls = record_token_batches(monkeypatch)
    common = ["--data", f"text:{data}", "--src-lang", "en", "--tgt-lang", "de",
              "--config", "tiny", "--vocab-size", "400", "--train-steps", "2",
              "--validate-every", "2", "--checkpoint-every", "0", "--warmup-steps", "4",
              "--batch-tokens", "256", "--max-length", "32", "--bleu-sentences", "0",
              "--verbose", "0", "--subword-sampling", "0.3", "--subword-nbest", "4"]
    run = tmp_path / "sampled"
    assert trainer.main(["--run-dir", str(run), *common]) == 0
    seen = [(c.get("repeat", False), c.get("subword_sampling")) for c in calls]
    assert seen == [(True, SubwordSampling(0.3, 4)), (False, None)]  # training, validation
    with open(run / "train_args.json") as f:
        recorded = f.read()
    assert '"subword_sampling": 0.3' in recorded and '"subword_nbest": 4' in recorded
    assert "its 4 most likely ones with probability P^0.3" in capsys.readouterr().out
    status = trainer.main(["--run-dir", str(tmp_path / "bpe"), *common,
                           "--vocab-model-type", "bpe"])
    assert status == 2
    assert "error: --subword-sampling: " in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "bpe" / "checkpoints")
