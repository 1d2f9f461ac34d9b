"""A SentencePiece vocabulary as tensorflow-text's LiteRT ops read it.

tensorflow-text's `FastSentencepieceTokenize` and
`FastSentencepieceDetokenize` are the only tokenizer ops with LiteRT
kernels. They take a flatbuffer that `pywrap_model_converter` builds from
a SentencePiece model, with two differences from SentencePiece itself that
matter here:

- the encoder runs a unigram Viterbi over the pieces' scores whatever the
  model's type, so only a unigram vocabulary segments as SentencePiece does
  (`in_model_tokenization` says whether a vocabulary qualifies; a BPE one's
  scores are merge ranks);
- the converter keeps NORMAL and USER_DEFINED pieces only, so byte-fallback
  pieces (`<0xNN>`, which `train_sentencepiece` enables) would decode to ""
  and characters outside the vocabulary would become unk. `fast_models`
  first rewrites each byte piece as a USER_DEFINED piece whose text is the
  raw byte, scored below every real piece: characters outside the
  vocabulary are then matched byte by byte, as SentencePiece's byte
  fallback does. Invalid UTF-8 in an output comes out as raw bytes, which
  the reader decodes with U+FFFD.

TensorFlow-only module (the export's side; the runtime reads the result).
"""

import struct

import numpy as np

# How far below the lowest real piece a rewritten byte piece scores, so a
# path through bytes never beats one through pieces.
BYTE_SCORE_MARGIN = 10.0


def _model(model_proto):
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_proto)
    return model


def model_type(model_proto):
    """The SentencePiece model's type, lower case: "unigram", "bpe",
    "word" or "char"."""
    from sentencepiece import sentencepiece_model_pb2

    spec = sentencepiece_model_pb2.TrainerSpec
    return spec.ModelType.Name(_model(model_proto).trainer_spec.model_type).lower()


def in_model_tokenization(model_proto):
    """`(True, "")` when tensorflow-text's LiteRT tokenizer segments like
    SentencePiece for this vocabulary (a unigram model), else `(False,
    why)`.

    Example:
    >>> from keras_transformer.data.synthetic import generate_corpus
    >>> from keras_transformer.tokenizer import train_sentencepiece
    >>> sources, targets = generate_corpus(num_train=200, num_val=0, num_test=0)["train"]
    >>> in_model_tokenization(train_sentencepiece(sources + targets, vocab_size=400))
    (True, '')
    """
    kind = model_type(model_proto)
    if kind == "unigram":
        return True, ""
    return False, (f"the vocabulary is a {kind} SentencePiece model; tensorflow-text's "
                   "LiteRT tokenizer segments by piece scores (unigram only), so the "
                   "caller tokenizes")


def _varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire_type, payload):
    return _varint(number << 3 | wire_type) + payload


def _byte_piece(value, score):
    """A serialized `ModelProto.SentencePiece` (fields 1 piece, 2 score, 3
    type) whose text is the single byte `value`. Written out because the
    protobuf runtime refuses a non-UTF-8 `string`, while the C++ parser
    the converter uses (proto2) takes it."""
    text = bytes([value])
    user_defined = 4  # ModelProto.SentencePiece.USER_DEFINED
    return (_field(1, 2, _varint(len(text)) + text) + _field(2, 5, struct.pack("<f", score))
            + _field(3, 0, _varint(user_defined)))


def byte_fallback_proto(model_proto, for_encoder=True):
    """`model_proto` with its byte pieces `<0xNN>` as USER_DEFINED raw
    bytes (module docstring). For the encoder, a byte whose character is a
    piece already stays as it is (the converter's trie keeps one id per
    text, and the real piece must win), and so does `<0x00>` (the trie
    takes no NUL)."""
    from sentencepiece import sentencepiece_model_pb2

    kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
    model = _model(model_proto)
    texts = {p.piece for p in model.pieces if p.type != kinds.BYTE}
    score = min(p.score for p in model.pieces) - BYTE_SCORE_MARGIN
    pieces = bytearray()
    for piece in model.pieces:
        value = int(piece.piece[3:5], 16) if piece.type == kinds.BYTE else 0
        if for_encoder and value < 0x80 and chr(value) in texts:
            value = 0
        message = _byte_piece(value, score) if value else piece.SerializeToString()
        pieces += _field(1, 2, _varint(len(message)) + message)
    del model.pieces[:]
    # Repeated field 1 may come before the other fields: protobuf merges.
    return bytes(pieces) + model.SerializeToString()


def space_piece_ids(model_proto):
    """The ids of the pieces made of the space symbol alone ("▁", "▁▁",
    ...). SentencePiece's decoder drops them at the start of an output,
    where tensorflow-text's keeps them as spaces."""
    return [i for i, piece in enumerate(_model(model_proto).pieces)
            if piece.piece and set(piece.piece) == {"\u2581"}]


def fast_models(source_proto, target_proto):
    """`(encoder, decoder)`: uint8 arrays of tensorflow-text's Fast
    SentencePiece models (byte fallback kept, `byte_fallback_proto`), the
    encoder of the source vocabulary and the decoder of the target's."""
    from tensorflow_text.core.pybinds import pywrap_model_converter as converter

    encoder = converter.convert_sentencepiece_model(byte_fallback_proto(source_proto))
    decoder = converter.convert_sentencepiece_model_for_decoder(
        byte_fallback_proto(target_proto, for_encoder=False))
    return np.frombuffer(encoder, np.uint8), np.frombuffer(decoder, np.uint8)
