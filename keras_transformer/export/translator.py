"""Tokenizer + model + beam search in one `tf.Module`: strings in, strings out.
TensorFlow-only module.

The same object translates in-process (`Translator.translate`) and is what
`export_translator` writes as a SavedModel for TF Serving. Its serving
functions use only core TensorFlow and tensorflow-text ops (no
`py_function`, no XLA-only ops), so a stock `tensorflow/serving` binary runs
them. One more, `translate_xla`, runs the same search compiled by XLA on
bucketed shapes (same translations, several times faster on CPU); TF Serving
runs it when started with `--xla_cpu_compilation_enabled=true`.

Input rules (every sentence gets a defined output; one bad sentence never
fails the batch):

- Bytes that are not valid UTF-8 are replaced by U+FFFD before tokenizing;
  the output is always valid UTF-8 (the same replacement is applied to it).
- Empty or whitespace-only input -> empty translation, score 0.0.
- A source longer than `config.max_length - 1` subword tokens is truncated
  to its first `config.max_length - 1` tokens, then eos is appended.
- The translation has at most `min(source tokens + 1 + extra_length,
  config.max_length)` tokens, eos included (paper: extra 50), counted per
  sentence, so a translation does not depend on the rest of its batch; a
  hypothesis that reaches the limit is cut there.
- Scores are `log P / ((5 + length) / 6) ** alpha` of the best hypothesis
  (always finite, <= 0).
"""

import json

import tensorflow as tf

from keras_transformer.decoding import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    beam_search_translate,
)

REPLACEMENT_CHARACTER = 0xFFFD

TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
BEAM_SIZE_SPEC = tf.TensorSpec([], tf.int32, name="beam_size")
ALPHA_SPEC = tf.TensorSpec([], tf.float32, name="alpha")
EXTRA_LENGTH_SPEC = tf.TensorSpec([], tf.int32, name="extra_length")

# XLA search: source lengths are padded up to a multiple of this, so a
# server compiles a handful of shapes (each on its first request of that
# shape, then reused for the life of the process).
SOURCE_LENGTH_BUCKET = 8
# The same for `Translator.translate(..., jit_compile=True)` (a test set,
# translated once): there compiling is most of the time, so fewer, coarser
# buckets pay (docs/performance.md).
TEST_SET_LENGTH_BUCKET = 16


class _Unchecked:
    """Holds an object out of sight of `tf.Module` tracking, so the Keras
    model is not saved (its variables are tracked once, explicitly)."""

    def __init__(self, value):
        self.value = value


def sanitize_utf8(text):
    """`text` `[batch]` string -> valid UTF-8, invalid bytes -> U+FFFD."""
    return tf.strings.unicode_transcode(
        text, input_encoding="UTF-8", output_encoding="UTF-8", errors="replace",
        replacement_char=REPLACEMENT_CHARACTER,
    )


class Translator(tf.Module):
    """A `Transformer` with its `SubwordTokenizer` and beam search.

    Args:
        model: a built `Transformer` (inference only; dropout is off).
        tokenizer: the `SubwordTokenizer` the model was trained with.
        beam_size, alpha, extra_length: defaults of `serving_default`
            (paper: 4, 0.6, 50), fixed at export.

    Serving functions (`tf.function`s with input signatures, exported as
    signatures by `export_translator`):

    - `serve(text [batch] string) -> {"translation": [batch] string,
      "score": [batch] float32}` with the defaults.
    - `serve_with_options(text, beam_size int32, alpha float32,
      extra_length int32)` -> the same.
    - `serve_ids(source_ids [batch, len] int32)` -> `{"translation_ids":
      [batch, out_len] int32, "score": [batch] float32}`: tokens as the
      tokenizer produces them (no bos/eos), right-padded with the pad id;
      output ids stop before eos and are padded with the pad id.
    - `serve_xla(text)`: `serve` with the search compiled by XLA. The batch
      is padded to a power of two (multiples of 64 past 64) with copies of
      its sentences and the source to a multiple of `SOURCE_LENGTH_BUCKET`
      tokens, so XLA compiles once per (rows, length) bucket, on the first
      request of that shape (seconds), and reuses it after.
    """

    def __init__(self, model, tokenizer, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                 extra_length=DEFAULT_EXTRA_LENGTH, name="translator"):
        super().__init__(name=name)
        config = model.config
        _check_matches(config, tokenizer)
        _check_search_options(beam_size, extra_length, config.output_vocab_size)
        self._model = _Unchecked(model)
        self.config = config
        self.tokenizer = tokenizer
        unique = {}
        for weight in model.weights:
            value = getattr(weight, "value", weight)
            unique.setdefault(id(value), value)
        # The only variables saved: each model weight once.
        self.model_variables = list(unique.values())
        self.beam_size = beam_size
        self.alpha = float(alpha)
        self.extra_length = extra_length
        self.max_source_tokens = config.max_length - 1
        self._xla_searches = _Unchecked({})

    @property
    def model(self):
        return self._model.value

    def metadata(self):
        """What a server or client needs to know, as a JSON-able dict."""
        return {
            "config": self.config.to_dict(),
            "beam_size": self.beam_size,
            "alpha": self.alpha,
            "extra_length": self.extra_length,
            "max_source_tokens": self.max_source_tokens,
            "truncation": (
                f"sources longer than {self.max_source_tokens} subword tokens keep "
                "their first tokens, then eos"
            ),
            "signatures": {
                "serving_default": "text [batch] string -> translation [batch] string, "
                                   "score [batch] float32",
                "translate_with_options": "text, beam_size int32, alpha float32, "
                                          "extra_length int32 -> translation, score",
                "translate_ids": "source_ids [batch, len] int32 (pad-padded, no eos) -> "
                                 "translation_ids [batch, len] int32, score [batch] float32",
                "translate_xla": "as serving_default, search compiled by XLA (TF Serving: "
                                 "--xla_cpu_compilation_enabled=true; first request of "
                                 "each shape bucket compiles)",
            },
        }

    # The graph -------------------------------------------------------------

    def _source_ids(self, tokens):
        """RaggedTensor `[batch, (len)]` -> `(source_ids [batch, src_len]
        int32, lengths [batch] int32 (eos included), is_empty [batch]
        bool)`: truncated, eos appended, padded."""
        config = self.config
        is_empty = tf.equal(tokens.row_lengths(), 0)
        tokens = tokens[:, : self.max_source_tokens]
        eos = tf.fill([tokens.nrows(), 1], tf.constant(config.eos_id, tf.int32))
        tokens = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)
        lengths = tf.cast(tokens.row_lengths(), tf.int32)
        return tokens.to_tensor(default_value=config.pad_id), lengths, is_empty

    def _translate_tokens(self, tokens, beam_size, alpha, extra_length):
        """RaggedTensor of source tokens -> `(best ids [batch, len] int32
        (pad after the last token, eos removed), scores [batch])`."""
        source_ids, lengths, is_empty = self._source_ids(tokens)
        sequences, scores = beam_search_translate(
            self.model, source_ids, beam_size, alpha, extra_length, source_length=lengths
        )
        return self._best(sequences, scores, is_empty)

    def _best(self, sequences, scores, is_empty):
        """The best beam of each sentence, eos and what follows it padded."""
        config = self.config
        best = sequences[:, 0]
        after_end = tf.cumsum(tf.cast(tf.equal(best, config.eos_id), tf.int32), axis=1) > 0
        best = tf.where(after_end | is_empty[:, None], config.pad_id, best)
        score = tf.where(is_empty, 0.0, scores[:, 0])
        return best, score

    def _translate_text(self, text, translate_tokens):
        """Strings in, strings out around `translate_tokens`: RaggedTensor of
        source tokens -> `(ids, scores)` (`_translate_tokens` in the graph,
        `_translate_tokens_static` under XLA)."""
        text = sanitize_utf8(text)
        blank = tf.equal(tf.strings.length(tf.strings.strip(text)), 0)
        tokens = self.tokenizer.tokenize(tf.where(blank, "", text))
        ids, score = translate_tokens(tokens)
        return {
            "translation": sanitize_utf8(self.tokenizer.detokenize(ids)),
            "score": score,
        }

    @tf.function(input_signature=[TEXT_SPEC], autograph=False)
    def serve(self, text):
        return self._translate_text(text, lambda tokens: self._translate_tokens(
            tokens, self.beam_size, self.alpha, self.extra_length))

    @tf.function(input_signature=[TEXT_SPEC, BEAM_SIZE_SPEC, ALPHA_SPEC, EXTRA_LENGTH_SPEC],
                 autograph=False)
    def serve_with_options(self, text, beam_size, alpha, extra_length):
        beam_size = _checked_beam_size(beam_size, self.config.output_vocab_size)
        extra_length = tf.maximum(extra_length, 0)
        return self._translate_text(text, lambda tokens: self._translate_tokens(
            tokens, beam_size, alpha, extra_length))

    @tf.function(input_signature=[IDS_SPEC], autograph=False)
    def serve_ids(self, source_ids):
        tokens = tf.RaggedTensor.from_tensor(source_ids, padding=self.config.pad_id)
        ids, score = self._translate_tokens(tokens, self.beam_size, self.alpha,
                                            self.extra_length)
        return {"translation_ids": ids, "score": score}

    @tf.function(input_signature=[TEXT_SPEC], autograph=False)
    def serve_xla(self, text):
        search = self._xla_search(self.beam_size, self.alpha, self.extra_length)
        return self._translate_text(
            text, lambda tokens: self._translate_tokens_static(tokens, search))

    def signatures(self):
        """The SavedModel signatures: name -> `tf.function` (each has its
        input signature). Functions, not concrete functions: `tf.saved_model.save`
        traces under its own context, so a concrete function traced here
        beforehand would be traced a second time there, doubling the
        export time."""
        return {
            "serving_default": self.serve,
            "translate_with_options": self.serve_with_options,
            "translate_ids": self.serve_ids,
            "translate_xla": self.serve_xla,
        }

    # In-process use --------------------------------------------------------

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None,
                  batch_size=32, jit_compile=False):
        """Translates a list of `str` (or bytes).

        Args:
            sentences: list of source sentences.
            beam_size, alpha, extra_length: None for the defaults.
            batch_size: sentences per call; sentences are grouped by length.
            jit_compile: run the search with XLA. Batches are padded to
                `batch_size` rows and source lengths to a multiple of
                `TEST_SET_LENGTH_BUCKET` (16), so XLA compiles once per
                length bucket, not once per batch. Same translations, faster
                on CPU (docs/performance.md).

        Returns: `(translations: list of str, scores: list of float)`.
        """
        if jit_compile:
            search = self._xla_search(
                self.beam_size if beam_size is None else int(beam_size),
                self.alpha if alpha is None else float(alpha),
                self.extra_length if extra_length is None else int(extra_length))
            return translate_in_batches(
                lambda batch: self._translate_text(batch, lambda tokens: (
                    self._translate_tokens_static(tokens, search, batch_size,
                                                  TEST_SET_LENGTH_BUCKET))),
                sentences, batch_size)
        if beam_size is None and alpha is None and extra_length is None:
            def run(batch):
                return self.serve(batch)
        else:
            options = (
                tf.constant(self.beam_size if beam_size is None else beam_size, tf.int32),
                tf.constant(self.alpha if alpha is None else alpha, tf.float32),
                tf.constant(self.extra_length if extra_length is None else extra_length,
                            tf.int32),
            )

            def run(batch):
                return self.serve_with_options(batch, *options)
        return translate_in_batches(run, sentences, batch_size)

    def _xla_search(self, beam_size, alpha, extra_length):
        """An XLA-compiled `(source_ids, lengths) -> (sequences, scores)`,
        one per set of search options (they fix shapes, so they are Python
        constants). `lengths` are the sentences' own lengths, so output
        limits (and translations) do not depend on the padding."""
        _check_search_options(beam_size, extra_length, self.config.output_vocab_size)
        key = (beam_size, alpha, extra_length)
        searches = self._xla_searches.value
        if key not in searches:
            model = self.model
            searches[key] = tf.function(
                lambda source_ids, lengths: beam_search_translate(
                    model, source_ids, beam_size, alpha, extra_length, lengths),
                jit_compile=True, autograph=False)
        return searches[key]

    def _translate_tokens_static(self, tokens, search, batch_size=None,
                                 length_bucket=SOURCE_LENGTH_BUCKET):
        """`_translate_tokens` with the XLA `search` on bucketed shapes: pad
        to `[rows, length]` buckets -> search -> unpad. `rows` is
        `batch_size`, or with None `_row_bucket` of the batch; `length` a
        multiple of `length_bucket`, at most the model's `max_length`. Works
        eagerly and in a graph. (Tokenizing stays outside XLA: tf-text ops do
        not compile.)"""
        config = self.config
        source_ids, lengths, is_empty = self._source_ids(tokens)
        shape = tf.shape(source_ids)
        rows, length = shape[0], shape[1]
        bucket = -(-length // length_bucket) * length_bucket
        bucket = tf.minimum(tf.maximum(bucket, length_bucket), config.max_length)
        source_ids = tf.pad(source_ids, [[0, 0], [0, bucket - length]],
                            constant_values=config.pad_id)
        # Filler rows repeat real ones, so they finish when the batch does
        # (the search stops early once every row has finished); an empty
        # batch gets a one-token sentence instead.
        empty_sentence = tf.where(tf.range(bucket) == 0, config.eos_id, config.pad_id)
        candidates = tf.concat([source_ids, empty_sentence[None]], axis=0)
        target_rows = _row_bucket(rows) if batch_size is None else batch_size
        picks = tf.range(target_rows) % tf.maximum(rows, 1)
        sequences, scores = search(tf.gather(candidates, picks),
                                   tf.gather(tf.concat([lengths, [1]], axis=0), picks))
        return self._best(sequences[:rows], scores[:rows], is_empty)


def _row_bucket(rows):
    """Rows an XLA batch is padded to: the next power of two up to 64, then
    the next multiple of 64 (scalar int32 tensor)."""
    powers = tf.constant([1, 2, 4, 8, 16, 32, 64], tf.int32)
    small = tf.reduce_min(tf.where(powers >= rows, powers, 64))
    return tf.where(rows <= 64, small, -(-rows // 64) * 64)


def translate_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings)) -> {"translation", "score"}`
    on length-sorted batches and returns `(translations, scores)` in the
    input order, as `str` and `float`."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, received {batch_size}.")
    sentences = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    translations, scores = [None] * len(sentences), [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        out = run(tf.constant([sentences[i] for i in indices], tf.string))
        for i, text, score in zip(indices, out["translation"].numpy(), out["score"].numpy()):
            translations[i] = text.decode("utf-8")
            scores[i] = float(score)
    return translations, scores


def _check_search_options(beam_size, extra_length, vocab_size):
    """Python-side checks of search options that fix shapes."""
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"`beam_size` must be an int >= 1, received {beam_size!r}.")
    if not isinstance(extra_length, int) or extra_length < 0:
        raise ValueError(f"`extra_length` must be an int >= 0, received {extra_length!r}.")
    if 2 * beam_size > vocab_size:
        raise ValueError(
            f"`beam_size` ({beam_size}) must be at most half the vocabulary ({vocab_size})."
        )


def _checked_beam_size(beam_size, vocab_size):
    """A clear error (for the whole request) on a beam size outside
    `[1, vocab_size // 2]`."""
    check = tf.debugging.assert_equal(
        (beam_size >= 1) & (2 * beam_size <= vocab_size), True,
        message=f"beam_size must be between 1 and {vocab_size // 2}",
    )
    with tf.control_dependencies([check]):
        return tf.identity(beam_size)


def _check_matches(config, tokenizer):
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(config, name) != getattr(tokenizer, name):
            raise ValueError(
                f"The model's {name} ({getattr(config, name)}) differs from the "
                f"tokenizer's ({getattr(tokenizer, name)}): not the model's tokenizer."
            )
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"The tokenizer has {tokenizer.vocab_size} pieces but the model's "
            f"vocabulary only {config.vocab_size}: not the model's tokenizer."
        )


def metadata_json(translator):
    return json.dumps(translator.metadata(), indent=2, sort_keys=True)


def translator_from_run_directory(run_dir, checkpoint=None, **kwargs):
    """A `Translator` for a run directory's model (its averaged checkpoint if
    any, else the latest, or `checkpoint`) and tokenizer. `kwargs`: the
    `Translator` decoding defaults."""
    from keras_transformer.run_directory import RunDirectory

    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
    config = run.load_config().replace(dropout=0.0)
    model = run.load_model(checkpoint=checkpoint, config=config)
    return Translator(model, run.load_tokenizer(), **kwargs)
