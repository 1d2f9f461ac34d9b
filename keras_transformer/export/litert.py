"""LiteRT (TensorFlow Lite) export: a `Translator` as one `.tflite` file
with beam search inside, for phones and edge boards.

Layout of an export directory (`kt-export --format litert` writes it as
`<output-dir>/<name>_litert/<version>/`)::

    model.tflite                    the translator (signatures below)
    shared.spm                      the SentencePiece model (source.spm and
                                    target.spm when the vocabularies differ)
    keras_transformer_litert.json   what was exported (`litert_translator.read_metadata`)

The file has two signatures, named as the SavedModel's and answering the
same way (`export/signatures.py`): `serving_default` and
`translate_with_options` (`beam_size` int32, `alpha` float32,
`extra_length` int32 scalars), outputs `translation` string and `score`
float32. What differs, and why:

- **Tokenization.** With a unigram vocabulary the first input is `text`
  `[1]` string and the file tokenizes and detokenizes inside, with
  tensorflow-text's Fast SentencePiece ops (`fast_sentencepiece.py`).
  tensorflow-text's LiteRT tokenizer cannot segment a BPE vocabulary (kt-demo
  trains one), so for BPE the first input is `source_ids` `[1, len]` int32
  (the source's pieces, no eos, as the SavedModel's `translate_ids` takes
  them), the caller tokenizes with the SentencePiece model, and the file still
  detokenizes. `LiteRTTranslator` does either; the metadata's
  `tokenization` says which ("in_model" or "caller").
- **One sentence per call.** tensorflow-text's LiteRT detokenizer keeps its
  output's declared shape, so a dynamic batch above one corrupts its
  output; the batch is fixed at 1.
- **Option checks.** The converter drops the graph's asserts, so the file
  does not refuse an option out of range; `LiteRTTranslator` checks them
  first, with the SavedModel's messages (`decoding.search_options`).
  `extra_length` is clamped to `max_length` in the file, as in the SavedModel.
- **Input rules.** Invalid UTF-8 in and out is the reader's to replace
  (U+FFFD); a blank sentence translates to "" with score 0.0; sources keep
  their first `max_length - 1` pieces.

The ops are LiteRT built-ins (the search's WHILE loop, TOPK_V2, GATHER, ...)
and, for tokenization, `TFText>FastSentencepieceTokenize` and
`TFText>FastSentencepieceDetokenize`, which the runtime registers from
`tensorflow_text.tflite_registrar`; no Flex (SELECT_TF_OPS) op. The export
fails if the converter leaves any other op (`LITERT_CUSTOM_OPS`).

Quantization (`QUANTIZATIONS`): "float32" (the SavedModel's translations),
"dynamic-int8" (int8 weights, float32 activations; about 40% of the size)
and "float16" (float16 weights widened to float32 on load, float32
arithmetic; `litert_float16.py` says why not the converter's float16 mode).

TensorFlow-only module.
"""

import contextlib
import io
import json
import os
import re
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.decoding import beam_search_translate
from keras_transformer.export.engine import SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS
from keras_transformer.export.fast_sentencepiece import (
    fast_models,
    in_model_tokenization,
    space_piece_ids,
)
from keras_transformer.export.litert_float16 import float16_weights
from keras_transformer.export.litert_translator import METADATA_FILE, MODEL_FILE
from keras_transformer.files import replace_directory

QUANTIZATIONS = ("float32", "dynamic-int8", "float16")
SOURCE_VOCABULARY = "source.spm"
TARGET_VOCABULARY = "target.spm"
SHARED_VOCABULARY = "shared.spm"  # when source and target share one
# The only ops that may be neither LiteRT built-ins nor refused.
LITERT_CUSTOM_OPS = ("TFText>FastSentencepieceTokenize", "TFText>FastSentencepieceDetokenize")
SIGNATURES = (SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS)


class LiteRTModule(tf.Module):
    """The functions `export_litert` converts: a `Translator`'s model and
    search defaults, one sentence per call (module docstring).

    Args:
        translator: a `Translator` (its model, tokenizers, defaults).
        tokenize_in_model: the first input is `text` and the graph
            tokenizes (a unigram source vocabulary), else `source_ids`.
    """

    def __init__(self, translator, tokenize_in_model):
        super().__init__(name="litert_translator")
        self._translator = [translator]  # a list: not tracked
        self.config = translator.config
        # The model's tf.Variables, each once: converting through a
        # SavedModel then freezes them into the file's constants.
        self.model_variables = list(translator.model_variables)
        encoder, decoder = fast_models(translator.tokenizer.model_proto,
                                       translator.target_tokenizer.model_proto)
        self.encoder_model = tf.constant(encoder)
        self.decoder_model = tf.constant(decoder)
        spaces = space_piece_ids(translator.target_tokenizer.model_proto)
        self.space_ids = tf.constant(spaces or [-1], tf.int32)
        self.tokenize_in_model = tokenize_in_model
        first = (tf.TensorSpec([1], tf.string, name="text") if tokenize_in_model
                 else tf.TensorSpec([1, None], tf.int32, name="source_ids"))
        options = [tf.TensorSpec([], tf.int32, name="beam_size"),
                   tf.TensorSpec([], tf.float32, name="alpha"),
                   tf.TensorSpec([], tf.int32, name="extra_length")]
        self.serving_default = tf.function(self._serving_default, input_signature=[first],
                                           autograph=False)
        self.translate_with_options = tf.function(
            self._translate_with_options, input_signature=[first] + options,
            autograph=False)

    def signatures(self):
        return {SERVING_DEFAULT: self.serving_default,
                TRANSLATE_WITH_OPTIONS: self.translate_with_options}

    def _serving_default(self, source):
        translator = self._translator[0]
        return self._translate(source, translator.beam_size, translator.alpha,
                               translator.extra_length)

    def _translate_with_options(self, source, beam_size, alpha, extra_length):
        extra_length = tf.clip_by_value(extra_length, 0, self.config.max_length)
        return self._translate(source, beam_size, alpha, extra_length)

    def _pieces(self, source):
        """The source's pieces `[1, len]` int32 (pad after them) and their
        count `[1]`, with built-in ops only (no ragged tensors)."""
        pad = self.config.pad_id
        if not self.tokenize_in_model:
            return source, tf.reduce_sum(tf.cast(tf.not_equal(source, pad), tf.int32), 1)
        from tensorflow_text.python.ops.fast_sentencepiece_tokenizer import (
            gen_fast_sentencepiece_tokenizer as fast_ops,
        )

        values, splits = fast_ops.tf_text_fast_sentencepiece_tokenize(
            self.encoder_model, source, 0, 0.0, False, False, False,
            out_type=tf.int32, Tsplits=tf.int32)
        lengths = splits[1:] - splits[:-1]
        width = tf.maximum(tf.reduce_max(lengths), 1)
        positions = tf.range(width)[None, :]
        flat = tf.concat([values, [pad]], axis=0)  # so an empty source gathers
        index = tf.minimum(splits[:-1, None] + positions, tf.shape(values)[0])
        return tf.where(positions < lengths[:, None], tf.gather(flat, index), pad), lengths

    def _translate(self, source, beam_size, alpha, extra_length):
        translator, config = self._translator[0], self.config
        pad, eos = config.pad_id, config.eos_id
        pieces, lengths = self._pieces(source)
        is_empty = tf.equal(lengths, 0)
        # Truncated to max_length - 1 pieces, eos appended, pad after.
        kept = tf.minimum(lengths, translator.max_source_tokens)
        pieces = pieces[:, :translator.max_source_tokens]
        pieces = tf.pad(pieces, [[0, 0], [0, 1]], constant_values=pad)
        positions = tf.range(tf.shape(pieces)[1])[None, :]
        source_ids = tf.where(positions < kept[:, None], pieces,
                              tf.where(positions == kept[:, None], eos, pad))
        sequences, scores = beam_search_translate(
            translator.model, source_ids, beam_size, alpha, extra_length,
            source_length=kept + 1, min_length=translator.min_length)
        best, score = translator._cleaned(sequences[:, 0], scores[:, 0], is_empty)
        return {"translation": self._detokenize(best), "score": score}

    def _detokenize(self, ids):
        from tensorflow_text.python.ops.fast_sentencepiece_tokenizer import (
            gen_fast_sentencepiece_tokenizer as fast_ops,
        )

        config = self.config
        keep = tf.not_equal(ids, config.pad_id) & tf.not_equal(ids, config.bos_id)
        # Space-only pieces before the first other piece are dropped, as
        # SentencePiece's decoder drops them.
        space = tf.reduce_any(tf.equal(ids[:, :, None], self.space_ids[None, None, :]), 2)
        keep &= tf.cumsum(tf.cast(keep & ~space, tf.int32), axis=1) > 0
        values = tf.boolean_mask(ids, keep)
        splits = tf.concat([[0], tf.cumsum(tf.reduce_sum(tf.cast(keep, tf.int32), 1))], 0)
        return fast_ops.tf_text_fast_sentencepiece_detokenize(self.decoder_model, values,
                                                              splits)


def op_counts(tflite_bytes):
    """`{op name: count}` of a `.tflite` file's operators, from LiteRT's
    model analyzer (custom ops under their custom names)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tf.lite.experimental.Analyzer.analyze(model_content=tflite_bytes)
    names = re.findall(r"Op#\d+ ([A-Za-z0-9_>]+)\(", out.getvalue())
    return {name: names.count(name) for name in sorted(set(names))}


def _convert(saved_model_dir, quantization):
    converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir, list(SIGNATURES))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    converter.allow_custom_ops = True  # the two tensorflow-text ops only (checked)
    if quantization == "dynamic-int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converted = converter.convert()
    return float16_weights(converted) if quantization == "float16" else converted


def export_litert(translator, output_dir, quantization="float32"):
    """Writes `translator` as a LiteRT export directory (layout: the module
    docstring), atomically: into a temporary directory beside `output_dir`,
    then renamed; an existing `output_dir` is replaced once the new one is
    complete.

    Args:
        translator: a `Translator` (its model and tokenizers; its
            beam_size, alpha, extra_length and min_length become the
            file's defaults).
        output_dir: the directory to write.
        quantization: "float32", "dynamic-int8" or "float16" (the
            module docstring).

    Returns: `output_dir`.

    Raises: `ValueError` for an unknown quantization, or naming every op
    the converter left that is neither built-in nor in `LITERT_CUSTOM_OPS`.

    Example:
    >>> import tempfile, keras, keras_transformer as kt
    >>> from keras_transformer.data.synthetic import generate_corpus
    >>> from keras_transformer.export import Translator
    >>> from keras_transformer.export.litert_translator import LiteRTTranslator
    >>> from keras_transformer.tokenizer import SubwordTokenizer, train_sentencepiece
    >>> sources, targets = generate_corpus(num_train=200, num_val=0, num_test=0)["train"]
    >>> tokenizer = SubwordTokenizer(train_sentencepiece(sources + targets, vocab_size=400))
    >>> model = kt.Transformer(kt.get_config("tiny", vocab_size=tokenizer.vocab_size,
    ...                                      max_length=16))
    >>> model.build()
    >>> translator = Translator(model, tokenizer, beam_size=2, extra_length=3)
    >>> path = export_litert(translator, tempfile.mkdtemp() + "/tiny_litert/1")
    >>> translations, scores = LiteRTTranslator(path).translate(["a cat", ""])
    >>> translations == translator.translate(["a cat", ""])[0]
    True
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                         f"received {quantization!r}.")
    in_model, why = in_model_tokenization(translator.tokenizer.model_proto)
    module = LiteRTModule(translator, in_model)
    output_dir = os.path.abspath(output_dir)
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(dir=parent, prefix=".tmp-" + os.path.basename(output_dir))
    try:
        saved = os.path.join(work, "saved_model")
        tf.saved_model.save(module, saved, signatures=module.signatures())
        tflite = _convert(saved, quantization)
        shutil.rmtree(saved)
        ops = op_counts(tflite)
        unexpected = sorted(name for name in ops
                            if not re.fullmatch(r"[A-Z0-9_]+", name)
                            and name not in LITERT_CUSTOM_OPS)
        if unexpected:
            raise ValueError("The LiteRT converter left ops that are neither LiteRT "
                             f"built-ins nor tensorflow-text's: {', '.join(unexpected)}.")
        new = os.path.join(work, "export")
        os.makedirs(new)
        with open(os.path.join(new, MODEL_FILE), "wb") as f:
            f.write(tflite)
        vocabularies = _vocabulary_files(translator)
        for name, proto in vocabularies.items():
            with open(os.path.join(new, name), "wb") as f:
                f.write(proto)
        metadata = _metadata(translator, in_model, why, quantization, ops, len(tflite),
                             list(vocabularies))
        with open(os.path.join(new, METADATA_FILE), "w") as f:
            json.dump(metadata, f, indent=1)
        replace_directory(new, output_dir)  # flushes every file first
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return output_dir


def _vocabulary_files(translator):
    """`{file name: SentencePiece model}`: `SHARED_VOCABULARY` alone when
    source and target share it, else `SOURCE_VOCABULARY` and
    `TARGET_VOCABULARY`."""
    source, target = translator.tokenizer, translator.target_tokenizer
    if source.model_proto == target.model_proto:
        return {SHARED_VOCABULARY: source.model_proto}
    return {SOURCE_VOCABULARY: source.model_proto, TARGET_VOCABULARY: target.model_proto}


def _metadata(translator, in_model, why, quantization, ops, size, vocabularies):
    config = translator.config
    first = ("text [1] string" if in_model
             else "source_ids [1, len] int32 (the source's pieces, no eos)")
    return {
        "format": "litert",
        "config": config.to_dict(),
        "tokenization": "in_model" if in_model else "caller",
        "tokenization_why": why,
        "source_vocabulary": vocabularies[0],
        "target_vocabulary": vocabularies[-1],
        "special_ids": {"pad": config.pad_id, "bos": config.bos_id, "eos": config.eos_id},
        "defaults": {"beam_size": translator.beam_size, "alpha": translator.alpha,
                     "extra_length": translator.extra_length},
        "min_length": translator.min_length,
        "max_source_tokens": translator.max_source_tokens,
        "max_length": config.max_length,
        "target_vocab_size": translator.target_tokenizer.vocab_size,
        "batch_size": 1,
        "quantization": quantization,
        "bytes": size,
        "ops": ops,
        "signatures": {
            SERVING_DEFAULT: f"{first} -> translation [1] string, score [1] float32",
            TRANSLATE_WITH_OPTIONS: f"{first}, beam_size int32, alpha float32, "
                                    "extra_length int32 -> translation, score",
        },
    }

