"""Bringing your own SentencePiece model: one trained elsewhere with
SentencePiece's default ids (unk 0, bos 1, eos 2, no pad piece), and the
errors for files that cannot serve."""

import io

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer.data import batching
from keras_transformer.tokenizer import SubwordTokenizer, TokenizerModelError

CORPUS = [
    "a man rides his bike across the bridge .",
    "two dogs are playing in the snow while it snows .",
    "the girls cross the street .",
    "an old woman sells red apples at the market .",
    "three children run after a big blue ball .",
] * 30
TEXTS = ["the dogs cross the bridge .", "a woman sells apples .", "two children run ."]


def train(**flags):
    """A model trained as a user would, SentencePiece's defaults unless
    `flags` say otherwise; returns its bytes."""
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=buffer, vocab_size=80,
        hard_vocab_limit=False, minloglevel=2, **flags)
    return buffer.getvalue()


def save(tmp_path, data, name="user.model"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


@pytest.fixture
def default_ids_model(tmp_path):
    return save(tmp_path, train())


def test_the_pad_id_is_added_past_the_pieces(default_ids_model):
    processor = sentencepiece.SentencePieceProcessor(model_file=default_ids_model)
    assert processor.pad_id() == -1  # what the test is about
    pieces = processor.get_piece_size()
    tokenizer = SubwordTokenizer.from_file(default_ids_model)
    assert (tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2)
    assert tokenizer.piece_count == pieces and tokenizer.added_pad
    assert tokenizer.pad_id == pieces and tokenizer.vocab_size == pieces + 1


def test_round_trip_and_the_pad_is_never_produced(default_ids_model):
    tokenizer = SubwordTokenizer.from_file(default_ids_model)
    ids = tokenizer.tokenize(tf.constant(TEXTS + ["zzz unseen ~ text"]))
    assert ids.dtype == tf.int32
    flat = ids.flat_values.numpy()
    assert flat.max() < tokenizer.piece_count and tokenizer.pad_id not in flat
    assert [t.decode() for t in tokenizer.detokenize(ids[:3]).numpy()] == TEXTS


def test_detokenize_drops_the_added_pad_with_or_without_strip_special(default_ids_model):
    tokenizer = SubwordTokenizer.from_file(default_ids_model)
    ids = tokenizer.tokenize(tf.constant(TEXTS)).to_tensor(default_value=tokenizer.pad_id)
    assert (ids.numpy() == tokenizer.pad_id).any()  # padded rows reach detokenize
    bos = np.full([len(TEXTS), 1], tokenizer.bos_id, np.int32)
    eos = np.full([len(TEXTS), 1], tokenizer.eos_id, np.int32)
    pad = np.full([len(TEXTS), 2], tokenizer.pad_id, np.int32)
    framed = np.concatenate([bos, ids.numpy(), eos, pad], axis=1)
    for strip in (True, False):
        got = tokenizer.detokenize(framed, strip_special=strip).numpy()
        assert [t.decode() for t in got] == TEXTS, strip


def test_id_to_piece_names_the_pad_and_rejects_other_ids(default_ids_model):
    tokenizer = SubwordTokenizer.from_file(default_ids_model)
    pieces = tokenizer.id_to_piece(tf.constant([tokenizer.unk_id, tokenizer.bos_id,
                                                tokenizer.eos_id, tokenizer.pad_id]))
    assert [p.decode() for p in pieces.numpy()] == ["<unk>", "<s>", "</s>", "<pad>"]
    ragged = tokenizer.id_to_piece(tf.ragged.constant([[tokenizer.pad_id], [0, 1]]))
    assert ragged.to_list() == [[b"<pad>"], [b"<unk>", b"<s>"]]
    # The tf-text op would crash the process on these.
    for bad in (tokenizer.vocab_size, -1):
        with pytest.raises(tf.errors.InvalidArgumentError, match="ids must be"):
            tokenizer.id_to_piece(tf.constant([3, bad]))


def test_batches_are_padded_with_the_added_pad_id(default_ids_model):
    tokenizer = SubwordTokenizer.from_file(default_ids_model)
    pairs = tf.data.Dataset.from_tensor_slices((TEXTS * 4, list(reversed(TEXTS)) * 4))
    seen, padded = [], 0
    for (source, target_in), target_out in batching.token_batches(
            pairs, tokenizer, batch_tokens=200, max_length=40).as_numpy_iterator():
        for side in (source, target_in, target_out):
            real = side != tokenizer.pad_id
            padded += (~real).sum()
            # Padding only at the ends of rows, never inside the text.
            assert (np.sort(real, axis=1)[:, ::-1] == real).all()
        texts = zip(tokenizer.detokenize(source).numpy(), tokenizer.detokenize(target_out).numpy())
        seen += [(s.decode(), t.decode()) for s, t in texts]
    assert padded > 0
    assert sorted(seen) == sorted(zip(TEXTS * 4, list(reversed(TEXTS)) * 4))


def test_a_model_with_its_own_pad_piece_keeps_it(tmp_path):
    path = save(tmp_path, train(pad_id=3))
    tokenizer = SubwordTokenizer.from_file(path)
    pieces = sentencepiece.SentencePieceProcessor(model_file=path).get_piece_size()
    assert (tokenizer.pad_id, tokenizer.vocab_size, tokenizer.added_pad) == (3, pieces, False)


@pytest.mark.parametrize("flags, missing", [
    ({"bos_id": -1}, "no bos id"),
    ({"eos_id": -1}, "no eos id"),
    ({"bos_id": -1, "eos_id": -1}, "no bos and no eos id"),
])
def test_a_model_without_bos_or_eos_says_how_to_retrain(tmp_path, flags, missing):
    path = save(tmp_path, train(**flags), "no_specials.model")
    with pytest.raises(TokenizerModelError,
                       match=rf"no_specials\.model: the SentencePiece model has {missing}.*"
                             r"--bos_id=1 --eos_id=2"):
        SubwordTokenizer.from_file(path)


def test_files_that_are_not_models_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.model: no such SentencePiece model"):
        SubwordTokenizer.from_file(str(tmp_path / "absent.model"))
    for name, data in (("text.model", b"this is a vocabulary, one word per line\n" * 3),
                       ("empty.model", b"")):
        path = save(tmp_path, data, name)
        with pytest.raises(TokenizerModelError, match=rf"{name}: .*SentencePiece model"):
            SubwordTokenizer.from_file(path)
    assert issubclass(TokenizerModelError, ValueError)  # kt-train reports ValueErrors
