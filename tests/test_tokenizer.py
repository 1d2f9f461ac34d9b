import builtins
import errno
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece

CORPUS = [
    "Ein Mann fährt mit dem Fahrrad über die Brücke.",
    "A man rides his bike across the bridge.",
    "Zwei Hunde spielen im Schnee, während es schneit!",
    "Two dogs are playing in the snow while it snows?",
    "Die Mädchen überqueren die Straße.",
    "The girls cross the street.",
] * 40


@pytest.fixture
def tokenizer():
    # Function scope: the autouse fixture's tf.random.set_seed destroys
    # eager resources, tf-text's SentencePiece resource included.
    return SubwordTokenizer(train_sentencepiece(CORPUS, vocab_size=400))


def test_special_ids_come_from_the_model(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert 300 < tokenizer.vocab_size <= 400


@pytest.mark.parametrize("text", [
    "Ein Mann fährt Fahrrad.",
    "Größe, Übermaß & Äpfel: «ß» — 100 % sicher?!",
    "Emoji never seen in training: 🚲🐕‍🦺 and Ωμέγα, 漢字.",
])
def test_detokenization_is_exact(tokenizer, text):
    ids = tokenizer.tokenize(tf.constant([text]))
    assert tokenizer.unk_id not in ids.flat_values.numpy()
    assert tokenizer.detokenize(ids).numpy()[0].decode("utf-8") == text


def test_detokenize_stops_at_eos_and_drops_padding(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["Two dogs"])).to_tensor()
    eos, pad = tokenizer.eos_id, tokenizer.pad_id
    padded = np.concatenate([ids.numpy(), [[eos, 77, pad, pad]]], axis=1)
    assert tokenizer.detokenize(padded).numpy()[0] == b"Two dogs"


class FailsMidway:
    """A file opened for writing whose `write` writes the first half of its
    bytes, then fails as a full disk does."""

    def __init__(self, file):
        self.file = file

    def write(self, data):
        self.file.write(data[:len(data) // 2])
        self.file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.file.close()


def failing_midway(opener):
    """`open` or `os.fdopen` whose files opened for writing fail midway."""
    def opened(file, mode="r", *args, **kwargs):
        f = opener(file, mode, *args, **kwargs)
        return FailsMidway(f) if set(mode) & set("wax+") else f
    return opened


def test_saves_atomically_and_reloads(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "run" / "vocab.model"
    tokenizer.save(str(path))
    saved = path.read_bytes()
    assert saved == tokenizer.model_proto
    # Saving another vocabulary over it fails after half of its bytes are
    # written, whichever way the file is opened.
    other = SubwordTokenizer(train_sentencepiece(CORPUS + ["Drei Katzen schlafen."] * 40,
                                                 vocab_size=400))
    assert other.model_proto != saved
    with monkeypatch.context() as m:
        m.setattr(builtins, "open", failing_midway(builtins.open))
        m.setattr(os, "fdopen", failing_midway(os.fdopen))
        with pytest.raises(OSError, match="No space left"):
            other.save(str(path))
    assert path.read_bytes() == saved  # the previous vocabulary, whole
    assert [p.name for p in path.parent.iterdir()] == ["vocab.model"]  # no temporary file
    reloaded = SubwordTokenizer.from_file(str(path))
    text = tf.constant(["The girls cross the street."])
    np.testing.assert_array_equal(reloaded.tokenize(text).to_list(),
                                  tokenizer.tokenize(text).to_list())


def test_rejects_a_bad_model():
    with pytest.raises(ValueError, match="vocab_size"):
        train_sentencepiece(CORPUS, vocab_size=50)
    with pytest.raises(ValueError, match="SentencePiece"):
        SubwordTokenizer(b"")


@pytest.mark.parametrize("coverage", [0, -0.5, 1.0001, 2, "1.0", None, True])
def test_character_coverage_must_be_in_0_1(coverage):
    with pytest.raises(ValueError, match=r"`character_coverage` must be a number in \(0, 1\]"):
        train_sentencepiece(CORPUS, vocab_size=400, character_coverage=coverage)


def test_a_character_coverage_below_one_leaves_rare_characters_to_bytes():
    # One rare character among many common ones: 0.99 leaves it out of the
    # pieces, and byte fallback still gives it back exactly.
    rare = CORPUS + ["Das Wort ☃ kommt einmal vor."]
    full = SubwordTokenizer(train_sentencepiece(rare, vocab_size=400))
    partial = SubwordTokenizer(train_sentencepiece(rare, vocab_size=400, character_coverage=0.99))
    text = tf.constant(["☃"])
    assert full.tokenize(text).flat_values.shape[0] < partial.tokenize(text).flat_values.shape[0]
    assert partial.detokenize(partial.tokenize(text)).numpy()[0].decode() == "☃"
