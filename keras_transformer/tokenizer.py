"""Shared subword vocabulary: trained with the SentencePiece trainer, applied
in the TensorFlow graph with `tensorflow_text.SentencepieceTokenizer`.

TensorFlow-only module. The in-graph tokenizer is what later goes into the
exported SavedModel (TF Serving links the tf-text ops), so training, evaluation
and serving tokenize with the very same op and model proto.

Special ids are fixed when the vocabulary is trained (pad 0, unk 1, bos 2,
eos 3) and read back from the model proto, never assumed elsewhere: use
`tokenizer.pad_id` etc.
"""

import io
import os
import tempfile

import sentencepiece
import tensorflow as tf
import tensorflow_text

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
        character_coverage: 1.0 keeps every character (right for European
            languages); byte fallback covers whatever is left out.

    Returns:
        The serialized SentencePiece model proto (`bytes`).
    """
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


def write_atomically(path, data):
    """Writes `data` (bytes) to `path` via a temporary file and a rename, so a
    reader never sees a partial file, even after `kill -9`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class SubwordTokenizer(tf.Module):
    """In-graph SentencePiece tokenizer with the special ids of its model.

    Args:
        model_proto: serialized SentencePiece model (`bytes`), as returned by
            `train_sentencepiece` or read from a `.model` file.

    Pitfall: `tf.random.set_seed` (and `keras.utils.set_random_seed`) in
    eager mode destroys existing eager resources, this tokenizer's included;
    seed before creating it.

    `tokenize(strings [batch]) -> RaggedTensor int32 [batch, (len)]` (no
    bos/eos added); `detokenize(ids [batch, (len)]) -> strings [batch]`
    (ragged or dense; ids at or after the first eos and pad ids are dropped
    when `strip_special=True`).
    """

    def __init__(self, model_proto, name=None):
        super().__init__(name=name)
        if not isinstance(model_proto, bytes) or not model_proto:
            raise ValueError("`model_proto` must be the non-empty bytes of a SentencePiece model.")
        processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        self.model_proto = model_proto
        self.vocab_size = processor.get_piece_size()
        self.pad_id = processor.pad_id()
        self.unk_id = processor.unk_id()
        self.bos_id = processor.bos_id()
        self.eos_id = processor.eos_id()
        for name_, value in (("pad", self.pad_id), ("bos", self.bos_id), ("eos", self.eos_id)):
            if value < 0:
                raise ValueError(
                    f"The SentencePiece model has no {name_} id; train it with "
                    "`train_sentencepiece` (pad 0, unk 1, bos 2, eos 3)."
                )
        # A tf.Module attribute, so SavedModel export tracks the resource.
        self.sentencepiece = tensorflow_text.SentencepieceTokenizer(model=model_proto)

    @classmethod
    def from_file(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

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
        return self.sentencepiece.detokenize(ids)

    def id_to_piece(self, ids):
        return self.sentencepiece.id_to_string(ids)


def strip_after_eos(ids, eos_id, pad_id, bos_id):
    """Drops everything from the first `eos_id` on, and `pad_id`/`bos_id`
    anywhere. `ids`: RaggedTensor `[batch, (len)]`."""
    is_eos = tf.cast(tf.equal(ids, eos_id), tf.int32)
    before_eos = tf.equal(tf.cumsum(is_eos, axis=1), 0)
    keep = before_eos & tf.not_equal(ids, pad_id) & tf.not_equal(ids, bos_id)
    return tf.ragged.boolean_mask(ids, keep)
