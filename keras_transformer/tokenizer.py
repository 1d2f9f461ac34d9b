"""Subword vocabularies: trained with the SentencePiece trainer, applied in
the TensorFlow graph with `tensorflow_text.SentencepieceTokenizer`.

TensorFlow-only module. The in-graph tokenizer is what later goes into the
exported SavedModel (TF Serving links the tf-text ops), so training, evaluation
and serving tokenize with the very same op and model proto.

Special ids are fixed when the vocabulary is trained (`train_sentencepiece`:
pad 0, unk 1, bos 2, eos 3) and read back from the model proto, never assumed
elsewhere: use `tokenizer.pad_id` etc. A model trained elsewhere with
SentencePiece's defaults (unk 0, bos 1, eos 2, no pad piece) works too: its
pad id is the first id past its pieces (`SubwordTokenizer`).
"""

import hashlib
import io
import numbers
import os

import sentencepiece
import tensorflow as tf
import tensorflow_text

from keras_transformer.files import write_atomically

SPECIAL_IDS = dict(pad_id=0, unk_id=1, bos_id=2, eos_id=3)
MIN_VOCAB_SIZE = 384


def train_sentencepiece(
    sentences,
    vocab_size,
    model_type="unigram",
    character_coverage=1.0,
    input_sentence_size=2_000_000,
    seed_sentencepiece_size=1_000_000,
):
    """Trains one shared vocabulary on an iterable of sentences (both sides).

    Args:
        sentences: iterable of `str` (source and target sentences together).
        vocab_size: e.g. 37000 for WMT en-de (the paper), 8000 for small corpora.
            Treated as an upper bound on small corpora (`hard_vocab_limit=False`).
        model_type: "unigram" or "bpe".
        character_coverage: fraction of the corpus's characters the
            vocabulary covers, in (0, 1]. 1.0 keeps every character (right
            for European languages); SentencePiece suggests 0.9995 for
            languages with large character sets (Chinese, Japanese). Byte
            fallback covers whatever is left out.

    Returns:
        The serialized SentencePiece model proto (`bytes`).
    """
    if (isinstance(character_coverage, bool) or not isinstance(character_coverage, numbers.Real)
            or not 0 < character_coverage <= 1):
        raise ValueError(
            "`character_coverage` must be a number in (0, 1] (1.0: every character; "
            f"0.9995 for Chinese or Japanese), received {character_coverage!r}."
        )
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"`model_type` must be 'unigram' or 'bpe', received {model_type!r}.")
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"`vocab_size` must be at least {MIN_VOCAB_SIZE}: the 256 byte-fallback "
            f"pieces, the special ids and the corpus's characters; received {vocab_size}."
        )
    buffer = io.BytesIO()
    sentences = (s for s in sentences if s and not s.isspace())
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        # Bytes for anything outside the vocabulary (emoji, rare scripts), so
        # detokenize(tokenize(text)) == text instead of "<unk>".
        byte_fallback=True,
        # No NFKC: keep the text exactly as written so detokenization is exact.
        normalization_rule_name="identity",
        hard_vocab_limit=False,
        input_sentence_size=input_sentence_size,
        seed_sentencepiece_size=seed_sentencepiece_size,
        shuffle_input_sentence=True,
        minloglevel=2,
        **SPECIAL_IDS,
    )
    return buffer.getvalue()


class TokenizerModelError(ValueError):
    """A SentencePiece model file or proto cannot serve as a vocabulary."""


def sentencepiece_ids(model_proto):
    """Reads a SentencePiece model proto (no TensorFlow): `(processor,
    ids)`, `processor` a `sentencepiece.SentencePieceProcessor` and `ids` a
    dict of `piece_count`, `unk_id`, `bos_id`, `eos_id`, `pad_id`,
    `added_pad` and `vocab_size` under `SubwordTokenizer`'s rules (a model
    without a pad piece pads with the first id past its pieces).

    Raises `TokenizerModelError` for bytes that are not a SentencePiece
    model, or a model without bos or eos.
    """
    if not isinstance(model_proto, bytes) or not model_proto:
        raise TokenizerModelError(
            "`model_proto` must be the non-empty bytes of a SentencePiece model.")
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as e:  # sentencepiece's "ParseFromArray" failure.
        raise TokenizerModelError(
            f"not a SentencePiece model proto ({str(e).strip()}); expected the `.model` "
            "file that SentencePiece's trainer writes."
        ) from None
    bos_id, eos_id = processor.bos_id(), processor.eos_id()
    missing = [n for n, value in (("bos", bos_id), ("eos", eos_id)) if value < 0]
    if missing:
        raise TokenizerModelError(
            f"the SentencePiece model has no {' and no '.join(missing)} id, which "
            "translation needs (targets start with bos and end with eos). Retrain it "
            "with `--bos_id=1 --eos_id=2` (SentencePiece's defaults; or any free ids), "
            "or with `train_sentencepiece` (pad 0, unk 1, bos 2, eos 3)."
        )
    piece_count = processor.get_piece_size()
    pad_id = processor.pad_id()
    # No pad piece: padding gets the first id past the pieces, an embedding
    # row of its own that no text maps to.
    added_pad = pad_id < 0
    if added_pad:
        pad_id = piece_count
    return processor, dict(piece_count=piece_count, unk_id=processor.unk_id(),
                           bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                           added_pad=added_pad, vocab_size=piece_count + int(added_pad))


# The name `id_to_piece` gives the pad id of a model without a pad piece.
ADDED_PAD_PIECE = "<pad>"


class SubwordTokenizer(tf.Module):
    """In-graph SentencePiece tokenizer with the special ids of its model.

    Args:
        model_proto: serialized SentencePiece model (`bytes`), as returned by
            `train_sentencepiece` or read from a `.model` file.

    Attributes: `pad_id`, `unk_id`, `bos_id`, `eos_id` (ints from the model),
    `piece_count` (the model's pieces), `vocab_size` (ids the model needs
    embeddings for: `piece_count`, plus one where the model has no pad
    piece).

    A model without a pad piece (SentencePiece's default, `--pad_id=-1`) gets
    `pad_id = piece_count` and `vocab_size = piece_count + 1`: one embedding
    row used only for padding. `tokenize` never produces that id; `detokenize`
    drops it with or without `strip_special`, and `id_to_piece` names it
    `"<pad>"`. A model without bos or eos is rejected.

    Pitfall: `tf.random.set_seed` (and `keras.utils.set_random_seed`) in
    eager mode destroys existing eager resources, this tokenizer's included;
    seed before creating it.

    `tokenize(strings [batch]) -> RaggedTensor int32 [batch, (len)]` (no
    bos/eos added); `detokenize(ids [batch, (len)]) -> strings [batch]`
    (ragged or dense; ids at or after the first eos and pad ids are dropped
    when `strip_special=True`).

    Build one with `SubwordTokenizer.train(sentences, vocab_size)` or
    `SubwordTokenizer.load(path)`; `save(path)` writes the model file.

    Example:

    ```python
    import os
    import tempfile

    import keras_transformer as kt

    tok = kt.SubwordTokenizer.train(["a man rides a bike"] * 50 + ["a dog"] * 50,
                                    vocab_size=400)
    path = os.path.join(tempfile.mkdtemp(), "vocab.model")
    tok.save(path)
    assert kt.SubwordTokenizer.load(path).vocab_size == tok.vocab_size
    config = kt.get_config("tiny", tokenizer=tok)  # vocabulary size and special ids
    ```
    """

    def __init__(self, model_proto, name=None):
        super().__init__(name=name)
        self.model_proto = model_proto
        _, ids = sentencepiece_ids(model_proto)
        for field, value in ids.items():
            setattr(self, field, value)
        # A tf.Module attribute, so SavedModel export tracks the resource.
        # tensorflow-text keys the SentencePiece resource by its op's name, so
        # a loaded SavedModel with two vocabularies needs two names.
        digest = hashlib.sha256(model_proto).hexdigest()[:16]
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(
            model=model_proto, name=f"sentencepiece_{digest}")

    @classmethod
    def train(cls, sentences, vocab_size, model_type="unigram", character_coverage=1.0):
        """A new vocabulary trained on `sentences` (`train_sentencepiece`:
        pad 0, unk 1, bos 2, eos 3; `vocab_size` is an upper bound on a
        small corpus). Give both sides' sentences for one shared vocabulary
        (paper 3.4).

        Example:

        ```python
        import keras_transformer as kt

        tok = kt.SubwordTokenizer.train(
            [f"the dog {i} sees a cat" for i in range(200)], vocab_size=400)
        assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 2, 3)
        ids = tok.tokenize(["the dog sees a cat"])
        assert tok.detokenize(ids).numpy()[0] == b"the dog sees a cat"
        ```
        """
        return cls(train_sentencepiece(sentences, vocab_size, model_type=model_type,
                                       character_coverage=character_coverage))

    @classmethod
    def load(cls, path):
        """The tokenizer of a SentencePiece `.model` file (`from_file`)."""
        return cls.from_file(path)

    @classmethod
    def from_file(cls, path):
        """The tokenizer of the SentencePiece model file at `path`.

        Raises `FileNotFoundError` naming `path` when there is no such file,
        `TokenizerModelError` (a `ValueError`) naming it when it is not a
        usable SentencePiece model.
        """
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such SentencePiece model file.")
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise TokenizerModelError(f"{path}: the file is empty; expected a SentencePiece "
                                      "model.")
        try:
            return cls(data)
        except TokenizerModelError as e:
            raise TokenizerModelError(f"{path}: {e}") from None

    def save(self, path):
        """Writes the model proto to `path` atomically."""
        write_atomically(path, self.model_proto)

    def tokenize(self, strings):
        return tf.cast(self.sentencepiece.tokenize(strings), tf.int32)

    def detokenize(self, ids, strip_special=True):
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
        ids = tf.cast(ids, tf.int32)
        if strip_special:
            ids = strip_after_eos(ids, self.eos_id, self.pad_id, self.bos_id)
        elif self.added_pad:
            # The added pad id has no piece for the op to look up; SentencePiece
            # renders its own control pieces (pad, bos, eos) as nothing too.
            ids = tf.ragged.boolean_mask(ids, tf.not_equal(ids, self.pad_id))
        return self.sentencepiece.detokenize(ids)

    def id_to_piece(self, ids):
        """Pieces (`tf.string`, the shape of `ids`, dense or ragged) of ids in
        `[0, vocab_size)`; the added pad id is `"<pad>"`. Other ids raise
        `tf.errors.InvalidArgumentError` (the tf-text op would crash the
        process on them)."""
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(self.id_to_piece(ids.flat_values))
        ids = tf.cast(ids, tf.int32)
        checks = [
            tf.debugging.assert_non_negative(ids, message="ids must be >= 0"),
            tf.debugging.assert_less(ids, tf.constant(self.vocab_size, tf.int32),
                                     message=f"ids must be < vocab_size ({self.vocab_size})"),
        ]
        with tf.control_dependencies(checks):
            in_model = ids < self.piece_count
            pieces = self.sentencepiece.id_to_string(tf.where(in_model, ids, self.unk_id))
        if self.added_pad:
            pieces = tf.where(in_model, pieces, ADDED_PAD_PIECE)
        return pieces


def strip_after_eos(ids, eos_id, pad_id, bos_id):
    """Drops everything from the first `eos_id` on, and `pad_id`/`bos_id`
    anywhere. `ids`: RaggedTensor `[batch, (len)]`."""
    is_eos = tf.cast(tf.equal(ids, eos_id), tf.int32)
    before_eos = tf.equal(tf.cumsum(is_eos, axis=1), 0)
    keep = before_eos & tf.not_equal(ids, pad_id) & tf.not_equal(ids, bos_id)
    return tf.ragged.boolean_mask(ids, keep)
