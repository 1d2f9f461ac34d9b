"""Tokenizers + model + search in one `tf.Module`: strings in, strings out.
TensorFlow-only module.

The same object translates in-process (`Translator.translate`,
`translate_nbest`, `sample`, `explain`: the engine contract of
`export/engine.py`) and is what `export_translator` writes as a SavedModel
for TF Serving. Its serving functions use only core TensorFlow and
tensorflow-text ops (no `py_function`, no XLA-only ops), so a stock
`tensorflow/serving` binary runs them. One more, `translate_xla`, runs the
same search compiled by XLA on bucketed shapes (same translations, several
times faster on CPU); TF Serving runs it when started with
`--xla_cpu_compilation_enabled=true`.

Input rules (every sentence gets a defined output; one bad sentence never
fails the batch):

- Bytes that are not valid UTF-8 are replaced by U+FFFD before tokenizing;
  the output is always valid UTF-8 (the same replacement is applied to it).
- Empty or whitespace-only input -> empty translation, score 0.0.
- A source longer than `config.max_length - 1` subword tokens is truncated
  to its first `config.max_length - 1` tokens, then eos is appended.
- The translation has at most `min(source tokens + 1 + extra_length,
  config.max_length)` tokens, eos included (paper: extra 50), counted per
  sentence, so a translation does not depend on the rest of its batch. In
  beam search a hypothesis that reaches the limit ends there with eos, its
  probability charged (`beam_search`); a sample is cut there.
- Beam search scores are `log P / ((5 + length) / 6) ** alpha` of the
  hypothesis (always finite, <= 0); a sample's score is the model's
  (untempered) `log P` of the sampled tokens.
- n-best lists have n entries for every sentence (an empty one: n empty
  translations, score 0.0); different token sequences may detokenize to the
  same text.
- A sample depends only on the seed and the sentence's text (after the
  U+FFFD replacement), not on the batch or the sentence's place in it: the
  same sentence twice in one request gets the same sample; another seed
  gives another.
"""

import json

import tensorflow as tf

from keras_transformer import dispatch
from keras_transformer.decoding import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    DEFAULT_MIN_LENGTH,
    beam_search_translate,
    sample_translate,
)
from keras_transformer.decoding.common import check_min_length
from keras_transformer.decoding.ensemble import TransformerEnsemble
from keras_transformer.decoding.search_options import (
    OPTIONS,
    check_options,
)
from keras_transformer.export import column_blocks
from keras_transformer.export.engine import (
    SERVING_DEFAULT,
    SIGNATURES,
    TRANSLATE_EXPLAIN,
    TRANSLATE_IDS,
    TRANSLATE_NBEST,
    TRANSLATE_SAMPLE,
    TRANSLATE_WITH_OPTIONS,
    TRANSLATE_XLA,
    ExplainingEngine,
)

REPLACEMENT_CHARACTER = 0xFFFD


def _option_spec(name):
    """A scalar input of the option's dtype (`search_options.OPTIONS`)."""
    return tf.TensorSpec([], OPTIONS[name].dtype, name=name)


TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
BEAM_SIZE_SPEC = _option_spec("beam_size")
ALPHA_SPEC = _option_spec("alpha")
EXTRA_LENGTH_SPEC = _option_spec("extra_length")
N_SPEC = _option_spec("n")
TEMPERATURE_SPEC = _option_spec("temperature")
TOP_K_SPEC = _option_spec("top_k")
TOP_P_SPEC = _option_spec("top_p")
SEED_SPEC = _option_spec("seed")

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


class Translator(tf.Module, ExplainingEngine):
    """A `Transformer` with its `SubwordTokenizer`s, beam search and
    sampling.

    Args:
        model: a built `Transformer` (inference only; dropout is off).
        tokenizer: the `SubwordTokenizer` of the source language (of both
            with a shared vocabulary), as the model was trained.
        beam_size, alpha, extra_length: defaults of `serving_default`
            (paper: 4, 0.6, 50), fixed at export; `extra_length` is also
            the default of `translate_nbest` and `translate_sample`.
        target_tokenizer: the target language's `SubwordTokenizer`, which
            detokenizes the output; None: `tokenizer` (shared vocabulary).
            Both are tracked (`tokenizer`, `target_pieces`), so a SavedModel
            carries both vocabularies in its graph.
        xla_column_blocks: int >= 1. Above 1, the XLA search
            (`signature_translate_xla`, `translate(jit_compile=True)`)
            multiplies by copies of the decoder's weights and of the output
            table cut into this many column blocks
            (`export/column_blocks.py`, taken through
            `dispatch.using_column_blocks`) in products of at most
            `dispatch.COLUMN_BLOCK_MAX_ROWS` rows (8 sentences at beam 4):
            the same translations to float32 rounding, lower latency for a
            few sentences on CPU, and a SavedModel larger by those weights. The
            copies are taken here, so build the Translator from the trained
            weights (as `kt-export` does); later changes to the model's
            weights do not reach the XLA search. The graph signatures use
            the model's own weights.
        min_length: int >= 0, the fewest pieces before eos in every
            search and signature (a constant of the export); the default 1
            means no empty translation for a non-empty sentence, as fairseq
            and CTranslate2 decode. An empty sentence still gives "".

    Two kinds of methods, named apart:

    - The engine contract (`export/engine.py`), Python in, Python out:
      `translate`, `translate_nbest`, `sample`, `explain`, as every engine
      of the package has them.
    - The serving functions: `tf.function`s with input signatures, one per
      SavedModel signature that `export_translator` writes, each named
      `signature_<name>` after its signature (`export/engine.py` defines
      the names; `signatures()` maps each name to its function). The
      prefix keeps them apart from the contract's methods, whose names
      some signatures share (`translate_nbest`).

    The serving functions:

    - `signature_serving_default(text [batch] string) -> {"translation":
      [batch] string, "score": [batch] float32}` with the defaults.
    - `signature_translate_with_options(text, beam_size int32, alpha
      float32, extra_length int32)` -> the same.
    - `signature_translate_ids(source_ids [batch, len] int32)` ->
      `{"translation_ids": [batch, out_len] int32, "score": [batch]
      float32}`: tokens as the tokenizer produces them (no bos/eos),
      right-padded with the pad id; output ids stop before eos and are
      padded with the pad id.
    - `signature_translate_xla(text)`: `signature_serving_default` with the
      search compiled by XLA. The batch is padded to a power of two
      (multiples of 64 past 64) with copies of its sentences and the source
      to a multiple of `SOURCE_LENGTH_BUCKET` tokens, so XLA compiles once
      per (rows, length) bucket, on the first request of that shape
      (seconds), and reuses it after.
    - `signature_translate_nbest(text, n int32, beam_size int32, alpha
      float32, extra_length int32) -> {"translations": [batch, n] string,
      "scores": [batch, n] float32}`: the n best hypotheses of the beam
      search, best first; needs `1 <= n <= beam_size`.
    - `signature_translate_sample(text, temperature float32, top_k int32,
      top_p float32, seed int64, extra_length int32) -> {"translation",
      "score"}`: one sample per sentence (`sample_translate`; temperature
      0: greedy). Its uniforms are
      `tf.random.stateless_uniform([config.max_length], seed=[seed, hash])`
      per sentence, `hash` the sentence's
      `tf.strings.to_hash_bucket_fast(text, 2**62)`: no random state, so
      the same request gives the same samples, concurrently or not.
    - `signature_translate_explain(text, beam_size, alpha, extra_length) ->
      {"translation", "score", "source_pieces" [batch, S] string,
      "target_pieces" [batch, T] string, "token_log_probs" [batch, T]
      float32, "alignment" [batch, T, S] float32, "source_length" [batch]
      int32, "target_length" [batch] int32}`:
      `signature_translate_with_options`'s translation (the same search,
      so the same translation and score), explained by one teacher-forced
      pass of the model over it (see `explain`).

    Options outside their ranges (`beam_size` < 1 or above half the target
    vocabulary, `alpha` negative or not finite, `n` outside `[1,
    beam_size]`, `temperature` < 0,
    `top_k` < 0, `top_p` outside `(0, 1]`) fail the whole request with
    `InvalidArgumentError` naming the option, in the graph: TF Serving
    answers them with a 400 too.

    Example:

    ```python
    import keras_transformer as kt

    tok = kt.SubwordTokenizer.train([f"a bird {i} sings" for i in range(100)],
                                    vocab_size=400)
    model = kt.Transformer(kt.get_config("tiny", tokenizer=tok))
    model.build()
    translator = kt.Translator(model, tok, beam_size=4, alpha=0.6)
    translations, scores = translator.translate(["a bird sings", "a bird 7 sings"])
    nbest = translator.translate_nbest(["a bird sings"], n=2)   # [[(text, score)] * 2]
    assert len(translations) == 2 and len(nbest[0]) == 2
    ```
    """

    def __init__(self, model, tokenizer, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                 extra_length=DEFAULT_EXTRA_LENGTH, target_tokenizer=None,
                 xla_column_blocks=1, min_length=DEFAULT_MIN_LENGTH, name="translator"):
        super().__init__(name=name)
        config = model.config
        target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
        _check_matches(config, tokenizer, target_tokenizer)
        _check_search_options(beam_size, extra_length, config.output_vocab_size)
        check_min_length(min_length, tensor_ok=False)
        if isinstance(model, TransformerEnsemble) and xla_column_blocks != 1:
            raise ValueError("`xla_column_blocks` splits one model's layers; a "
                             "TransformerEnsemble takes the default, 1.")
        self._model = _Unchecked(model)
        self.config = config
        self.tokenizer = tokenizer
        self._target_tokenizer = _Unchecked(target_tokenizer)
        # What detokenizes the output (tracked): the tokenizer itself when
        # shared, else the target vocabulary under a resource name of its own.
        self.target_pieces = target_tokenizer
        unique = {}
        for weight in model.weights:
            value = getattr(weight, "value", weight)
            unique.setdefault(id(value), value)
        # The variables saved: each model weight once, and the column blocks.
        self.model_variables = list(unique.values())
        blocks = column_blocks.copies(model, xla_column_blocks)
        self.xla_column_blocks = xla_column_blocks
        self.column_block_variables = [v for v in tf.nest.flatten(list(blocks.values()))
                                       if v is not None]
        self._column_blocks = _Unchecked(blocks)
        self.beam_size = beam_size
        self.alpha = float(alpha)
        self.extra_length = extra_length
        self.min_length = min_length
        self.max_source_tokens = config.max_length - 1
        self._xla_searches = _Unchecked({})

    @property
    def model(self):
        return self._model.value

    @property
    def target_tokenizer(self):
        """The target `SubwordTokenizer` (`tokenizer` when shared)."""
        return self._target_tokenizer.value

    def metadata(self):
        """What a server or client needs to know, as a JSON-able dict."""
        return {
            "config": self.config.to_dict(),
            "beam_size": self.beam_size,
            "alpha": self.alpha,
            "extra_length": self.extra_length,
            "min_length": self.min_length,
            "max_source_tokens": self.max_source_tokens,
            "xla_column_blocks": self.xla_column_blocks,
            "shared_vocabulary": self.target_tokenizer is self.tokenizer,
            "source_vocab_size": self.tokenizer.vocab_size,
            "target_vocab_size": self.target_tokenizer.vocab_size,
            "truncation": (
                f"sources longer than {self.max_source_tokens} subword tokens keep "
                "their first tokens, then eos"
            ),
            "signatures": {
                SERVING_DEFAULT: "text [batch] string -> translation [batch] string, "
                                 "score [batch] float32",
                TRANSLATE_WITH_OPTIONS: "text, beam_size int32, alpha float32, "
                                        "extra_length int32 -> translation, score",
                TRANSLATE_IDS: "source_ids [batch, len] int32 (pad-padded, no eos) -> "
                               "translation_ids [batch, len] int32, score [batch] float32",
                TRANSLATE_XLA: f"as {SERVING_DEFAULT}, search compiled by XLA (TF Serving: "
                               "--xla_cpu_compilation_enabled=true; first request of "
                               "each shape bucket compiles)",
                TRANSLATE_NBEST: "text [batch] string, n int32, beam_size int32, alpha "
                                 "float32, extra_length int32 (1 <= n <= beam_size) -> "
                                 "translations [batch, n] string, scores [batch, n] "
                                 "float32, best first",
                TRANSLATE_SAMPLE: "text [batch] string, temperature float32 (0: greedy), "
                                  "top_k int32 (0: off), top_p float32 (1: off), seed "
                                  "int64, extra_length int32 -> translation [batch] "
                                  "string, score [batch] float32 (untempered log P); "
                                  "same seed and text, same sample",
                TRANSLATE_EXPLAIN: "text [batch] string, beam_size int32, alpha float32, "
                                   "extra_length int32 -> translation, score (as "
                                   f"{TRANSLATE_WITH_OPTIONS}), source_pieces [batch, S] "
                                   "string, target_pieces [batch, T] string, "
                                   "token_log_probs [batch, T] float32, alignment "
                                   "[batch, T, S] float32 (last decoder layer's "
                                   "cross-attention, mean over heads), source_length, "
                                   "target_length [batch] int32",
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
            self.model, source_ids, beam_size, alpha, extra_length, source_length=lengths,
            min_length=self.min_length)
        return self._best(sequences, scores, is_empty)

    def _best(self, sequences, scores, is_empty):
        """The best beam of each sentence, eos and what follows it padded."""
        return self._cleaned(sequences[:, 0], scores[:, 0], is_empty)

    def _cleaned(self, sequences, scores, is_empty):
        """Hypotheses `[batch, ..., len]` and scores `[batch, ...]`: eos and
        what follows it padded; empty sentences' hypotheses all pad, score
        0."""
        config = self.config
        empty = tf.reshape(is_empty, [-1] + [1] * (scores.shape.rank - 1))
        after_end = tf.cumsum(tf.cast(tf.equal(sequences, config.eos_id), tf.int32),
                              axis=-1) > 0
        sequences = tf.where(after_end | empty[..., None], config.pad_id, sequences)
        return sequences, tf.where(empty, 0.0, scores)

    def _tokens(self, text):
        """`text` `[batch]` string -> `(text, tokens)`: the text as
        tokenized (invalid UTF-8 replaced, blank ones empty) and its source
        tokens (RaggedTensor)."""
        text = sanitize_utf8(text)
        blank = tf.equal(tf.strings.length(tf.strings.strip(text)), 0)
        text = tf.where(blank, "", text)
        return text, self.tokenizer.tokenize(text)

    def _detokenize(self, ids):
        """Target ids `[batch, len]` -> valid UTF-8 strings `[batch]`."""
        return sanitize_utf8(self.target_pieces.detokenize(ids))

    def _translate_text(self, text, translate_tokens):
        """Strings in, strings out around `translate_tokens`: RaggedTensor of
        source tokens -> `(ids, scores)` (`_translate_tokens` in the graph,
        `_translate_tokens_static` under XLA)."""
        _, tokens = self._tokens(text)
        ids, score = translate_tokens(tokens)
        return {"translation": self._detokenize(ids), "score": score}

    @tf.function(input_signature=[TEXT_SPEC], autograph=False)
    def signature_serving_default(self, text):
        return self._translate_text(text, lambda tokens: self._translate_tokens(
            tokens, self.beam_size, self.alpha, self.extra_length))

    def _checked_options(self, beam_size, alpha, extra_length):
        """A request's search options, checked in the graph, so that every
        server of the SavedModel (TF Serving too) answers a bad value with
        InvalidArgument naming it (`graph_checks`, the ranges of
        `search_options.OPTIONS`; beam_size's bound is half the output
        vocabulary). Then `extra_length` is clamped to `config.max_length`: no output is
        longer than `max_length`."""
        checks = graph_checks(
            {"beam_size": beam_size, "alpha": alpha, "extra_length": extra_length},
            {"vocabulary": self.config.output_vocab_size})
        max_length = self.config.max_length
        with tf.control_dependencies(checks):
            return (tf.identity(beam_size), tf.identity(alpha),
                    tf.clip_by_value(extra_length, 0, max_length))

    @tf.function(input_signature=[TEXT_SPEC, BEAM_SIZE_SPEC, ALPHA_SPEC, EXTRA_LENGTH_SPEC],
                 autograph=False)
    def signature_translate_with_options(self, text, beam_size, alpha, extra_length):
        beam_size, alpha, extra_length = self._checked_options(beam_size, alpha, extra_length)
        return self._translate_text(text, lambda tokens: self._translate_tokens(
            tokens, beam_size, alpha, extra_length))

    @tf.function(input_signature=[IDS_SPEC], autograph=False)
    def signature_translate_ids(self, source_ids):
        tokens = tf.RaggedTensor.from_tensor(source_ids, padding=self.config.pad_id)
        ids, score = self._translate_tokens(tokens, self.beam_size, self.alpha,
                                            self.extra_length)
        return {"translation_ids": ids, "score": score}

    @tf.function(input_signature=[TEXT_SPEC], autograph=False)
    def signature_translate_xla(self, text):
        search = self._xla_search(self.beam_size, self.alpha, self.extra_length)
        return self._translate_text(
            text, lambda tokens: self._translate_tokens_static(tokens, search))

    @tf.function(input_signature=[TEXT_SPEC, N_SPEC, BEAM_SIZE_SPEC, ALPHA_SPEC,
                                  EXTRA_LENGTH_SPEC], autograph=False)
    def signature_translate_nbest(self, text, n, beam_size, alpha, extra_length):
        beam_size, alpha, extra_length = self._checked_options(beam_size, alpha, extra_length)
        with tf.control_dependencies(graph_checks({"n": n}, {"beam_size": beam_size})):
            n = tf.identity(n)
        _, tokens = self._tokens(text)
        source_ids, lengths, is_empty = self._source_ids(tokens)
        sequences, scores = beam_search_translate(
            self.model, source_ids, beam_size, alpha, extra_length, source_length=lengths,
            min_length=self.min_length)
        sequences, scores = self._cleaned(sequences[:, :n], scores[:, :n], is_empty)
        shape = tf.shape(sequences)
        texts = self._detokenize(tf.reshape(sequences, [-1, shape[2]]))
        return {"translations": tf.reshape(texts, shape[:2]), "scores": scores}

    @tf.function(input_signature=[TEXT_SPEC, TEMPERATURE_SPEC, TOP_K_SPEC, TOP_P_SPEC,
                                  SEED_SPEC, EXTRA_LENGTH_SPEC], autograph=False)
    def signature_translate_sample(self, text, temperature, top_k, top_p, seed,
                                   extra_length):
        checks = graph_checks({"temperature": temperature, "top_k": top_k, "top_p": top_p})
        with tf.control_dependencies(checks):
            temperature = tf.identity(temperature)
        _, _, extra_length = self._checked_options(1, 0.0, extra_length)
        text, tokens = self._tokens(text)
        source_ids, lengths, is_empty = self._source_ids(tokens)
        sequences, scores = sample_translate(
            self.model, source_ids, temperature, top_k, top_p,
            extra_length=extra_length, source_length=lengths,
            noise=self._sentence_noise(text, seed), min_length=self.min_length)
        ids, score = self._cleaned(sequences, scores, is_empty)
        return {"translation": self._detokenize(ids), "score": score}

    @tf.function(input_signature=[TEXT_SPEC, BEAM_SIZE_SPEC, ALPHA_SPEC, EXTRA_LENGTH_SPEC],
                 autograph=False)
    def signature_translate_explain(self, text, beam_size, alpha, extra_length):
        beam_size, alpha, extra_length = self._checked_options(beam_size, alpha, extra_length)
        _, tokens = self._tokens(text)
        source_ids, lengths, is_empty = self._source_ids(tokens)
        sequences, scores = beam_search_translate(
            self.model, source_ids, beam_size, alpha, extra_length, source_length=lengths,
            min_length=self.min_length)
        best = sequences[:, 0]
        ids, score = self._best(sequences, scores, is_empty)
        explained = self._explain(source_ids, lengths, best, is_empty)
        return {"translation": self._detokenize(ids), "score": score, **explained}

    def _explain(self, source_ids, source_length, best, is_empty):
        """One teacher-forced pass over the best hypotheses `best` `[batch,
        len]` (as the search wrote them: eos, then pad): each target
        piece's log-probability and the last decoder layer's cross-attention
        while predicting it, mean over heads (paper 3.2.3: the
        encoder-decoder attention; the last layer's is the one nearest the
        output). The target is the hypothesis up to its first eos, eos
        included (`beam_search` ends every hypothesis with eos, forced at
        the length limit); an empty sentence's is empty. Padding: ""
        pieces, 0.0."""
        config = self.config
        model = self.model
        if isinstance(model, TransformerEnsemble):
            raise ValueError("explain shows one model's cross-attention; a "
                             "TransformerEnsemble has one per member: explain with a member.")
        positions = tf.range(tf.shape(best)[1])[None]
        first_eos = tf.argmax(tf.cast(tf.equal(best, config.eos_id), tf.int32), axis=1,
                              output_type=tf.int32)
        target_length = tf.where(is_empty, 0, first_eos + 1)
        width = tf.maximum(tf.reduce_max(target_length), 1)
        target = best[:, :width]
        target_mask = positions[:, :width] < target_length[:, None]
        target = tf.where(target_mask, target, config.pad_id)
        inputs = tf.concat([tf.fill([tf.shape(best)[0], 1], config.bos_id), target[:, :-1]],
                           axis=1)
        memory, memory_mask = model.encode(source_ids, training=False)
        logits, weights = model.decode(inputs, memory, memory_mask, training=False,
                                       return_attention_weights=True)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        token_log_probs = tf.gather(log_probs, target, axis=2, batch_dims=2)
        token_log_probs = tf.where(target_mask, token_log_probs, 0.0)
        source_mask = tf.range(tf.shape(source_ids)[1])[None] < source_length[:, None]
        alignment = tf.reduce_mean(tf.cast(weights[-1][1], tf.float32), axis=1)
        alignment = tf.where(target_mask[:, :, None] & source_mask[:, None, :], alignment, 0.0)
        return {
            "source_pieces": self._pieces(self.tokenizer, source_ids, source_mask),
            "target_pieces": self._pieces(self.target_pieces, target, target_mask),
            "token_log_probs": token_log_probs,
            "alignment": alignment,
            "source_length": source_length,
            "target_length": target_length,
        }

    @staticmethod
    def _pieces(tokenizer, ids, mask):
        """SentencePiece pieces of `ids` where `mask`, else ""; ids past the
        tokenizer's vocabulary (rows a model may have beyond it) show as its
        unk piece."""
        ids = tf.where(mask & (ids < tokenizer.vocab_size), ids, tokenizer.unk_id)
        return tf.where(mask, tokenizer.id_to_piece(ids), "")

    def _sentence_noise(self, text, seed):
        """Uniforms `[batch, config.max_length]` float32 for sampling, row
        `b` from `stateless_uniform(seed=[seed, hash(text[b])])`: a
        sentence's sample depends on the seed and its text only. Width
        `config.max_length`, which bounds every search, so the width of a
        batch does not change a sentence's uniforms."""
        width = self.config.max_length
        keys = tf.strings.to_hash_bucket_fast(text, 2**62)
        seeds = tf.stack([tf.fill(tf.shape(keys), tf.cast(seed, tf.int64)), keys], axis=1)
        return tf.map_fn(
            lambda key: tf.random.stateless_uniform([width], seed=key, dtype=tf.float32),
            seeds, fn_output_signature=tf.TensorSpec([width], tf.float32))

    def signatures(self):
        """The SavedModel signatures: each name of `engine.SIGNATURES`, in
        its order -> the `tf.function` `signature_<name>` (each has its
        input signature). Functions, not concrete functions:
        `tf.saved_model.save` traces under its own context, so a concrete
        function traced here beforehand would be traced a second time there,
        doubling the export time."""
        return {name: getattr(self, f"signature_{name}") for name in SIGNATURES}

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
                return self.signature_serving_default(batch)
        else:
            options = self._search_options(beam_size, alpha, extra_length)

            def run(batch):
                return self.signature_translate_with_options(batch, *options)
        return translate_in_batches(run, sentences, batch_size)

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None,
                        batch_size=32):
        """The `n` best translations of each sentence (beam search, graph
        mode), with `translate`'s input rules.

        Args:
            sentences: list of `str` (or bytes).
            n: int >= 1, at most the beam size.
            beam_size: None: `max(n, the default beam size)`.
            alpha, extra_length: None for the defaults.
            batch_size: sentences per call.

        Returns: a list, per sentence, of `n` `(translation str, score
        float)` pairs, best first (an empty sentence: `n` times `("",
        0.0)`). The first is `translate`'s with the same options.

        Raises: `ValueError` if `n` exceeds `beam_size` or an option is
        out of range.
        """
        beam_size = nbest_beam_size(n, beam_size, self.beam_size)
        alpha = self.alpha if alpha is None else alpha
        extra_length = self.extra_length if extra_length is None else extra_length
        _check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
        options = (tf.constant(n, tf.int32), tf.constant(beam_size, tf.int32),
                   tf.constant(alpha, tf.float32), tf.constant(extra_length, tf.int32))
        return nbest_in_batches(lambda batch: self.signature_translate_nbest(batch, *options),
                                sentences, batch_size)

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None, batch_size=32):
        """One sampled translation per sentence (see
        `signature_translate_sample`), with `translate`'s input rules.

        Args:
            sentences: list of `str` (or bytes).
            temperature: float >= 0; 0 is greedy search.
            top_k: int >= 0; 0: no top-k cut.
            top_p: float in `(0, 1]`; 1.0: no nucleus cut.
            seed: int (int64): with the same seed a sentence gets the same
                sample, whatever its batch.
            extra_length: None for the default.
            batch_size: sentences per call.

        Returns: `(translations: list of str, scores: list of float)`, the
        scores the model's untempered log-probabilities of the sampled
        tokens.
        """
        extra_length = self.extra_length if extra_length is None else extra_length
        _check_search_options(1, extra_length, self.config.output_vocab_size)
        options = sampling_options(temperature, top_k, top_p, seed)
        return translate_in_batches(
            lambda batch: self.signature_translate_sample(
                batch, *options, tf.constant(extra_length, tf.int32)),
            sentences, batch_size)

    def explain(self, sentences, beam_size=None, alpha=None, extra_length=None,
                batch_size=32):
        """Translates and explains each sentence
        (`signature_translate_explain`, graph mode), with `translate`'s
        input rules.

        Args:
            sentences: list of `str` (or bytes).
            beam_size, alpha, extra_length: None for the defaults.
            batch_size: sentences per call.

        Returns: a list, per sentence, of dicts (see `explain_in_batches`):
        `translation` and `score` are `translate`'s with the same options.
        """
        options = self._search_options(beam_size, alpha, extra_length)
        return explain_in_batches(
            lambda batch: self.signature_translate_explain(batch, *options),
            sentences, batch_size)

    def _search_options(self, beam_size, alpha, extra_length):
        """`(beam_size, alpha, extra_length)` as the tensors the serving
        functions take, None meaning the default, after the Python-side
        checks."""
        beam_size = self.beam_size if beam_size is None else beam_size
        alpha = self.alpha if alpha is None else alpha
        extra_length = self.extra_length if extra_length is None else extra_length
        _check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
        return (tf.constant(beam_size, tf.int32), tf.constant(alpha, tf.float32),
                tf.constant(extra_length, tf.int32))

    def _xla_search(self, beam_size, alpha, extra_length):
        """An XLA-compiled `(source_ids, lengths) -> (sequences, scores)`,
        one per set of search options (they fix shapes, so they are Python
        constants). `lengths` are the sentences' own lengths, so output
        limits (and translations) do not depend on the padding."""
        _check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
        key = (beam_size, alpha, extra_length)
        searches = self._xla_searches.value
        if key not in searches:
            model = self.model
            blocks = self._column_blocks.value
            min_length = self.min_length

            def search(source_ids, lengths):
                with dispatch.using_column_blocks(blocks):
                    return beam_search_translate(model, source_ids, beam_size, alpha,
                                                 extra_length, lengths, min_length=min_length)

            searches[key] = tf.function(search, jit_compile=True, autograph=False)
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
    results = _in_batches(run, sentences, batch_size, lambda out: zip(
        (t.decode("utf-8") for t in out["translation"].numpy()),
        (float(s) for s in out["score"].numpy())))
    return [t for t, _ in results], [s for _, s in results]


def explain_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings))` -> the `translate_explain`
    signature's outputs on length-sorted batches and returns, in the input
    order, one dict per sentence, trimmed to its own lengths: `translation` (str),
    `score` (float), `source_pieces` (S str, eos last), `target_pieces` (T
    str), `token_log_probs` (T floats), `alignment` (T lists of S floats,
    row t the attention over the source while predicting target piece t)."""
    def unpack(out):
        out = {key: value.numpy() for key, value in out.items()}
        for b in range(len(out["translation"])):
            s, t = int(out["source_length"][b]), int(out["target_length"][b])
            yield {
                "translation": out["translation"][b].decode("utf-8"),
                "score": float(out["score"][b]),
                "source_pieces": [p.decode("utf-8") for p in out["source_pieces"][b, :s]],
                "target_pieces": [p.decode("utf-8") for p in out["target_pieces"][b, :t]],
                "token_log_probs": out["token_log_probs"][b, :t].tolist(),
                "alignment": out["alignment"][b, :t, :s].tolist(),
            }

    return _in_batches(run, sentences, batch_size, unpack)


def nbest_in_batches(run, sentences, batch_size=32):
    """Calls `run(tf.constant(batch of strings)) -> {"translations" [batch,
    n], "scores" [batch, n]}` on length-sorted batches and returns, in the
    input order, a list per sentence of `(str, float)` pairs."""
    return _in_batches(run, sentences, batch_size, lambda out: (
        [(t.decode("utf-8"), float(s)) for t, s in zip(texts, scores)]
        for texts, scores in zip(out["translations"].numpy(), out["scores"].numpy())))


def _in_batches(run, sentences, batch_size, unpack):
    """`unpack(run(batch))` (one item per sentence of the batch) over
    length-sorted batches, as a list in the input order."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, received {batch_size}.")
    sentences = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        out = run(tf.constant([sentences[i] for i in indices], tf.string))
        for i, item in zip(indices, unpack(out)):
            results[i] = item
    return results


def nbest_beam_size(n, beam_size, default_beam_size):
    """The beam size of an n-best search: `beam_size`, or with None
    `max(n, default_beam_size)`. `ValueError` unless `1 <= n <= beam
    size` (`search_options.OPTIONS["n"]`)."""
    OPTIONS["n"].check(n)
    beam_size = max(n, default_beam_size) if beam_size is None else beam_size
    check_options({"beam_size": beam_size, "n": n})
    return beam_size


def sampling_options(temperature, top_k, top_p, seed):
    """The sampling options as the tensors the `translate_sample` signature
    takes, after the Python-side checks (`ValueError` naming the option)."""
    check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                   "seed": seed})
    return (tf.constant(temperature, tf.float32), tf.constant(top_k, tf.int32),
            tf.constant(top_p, tf.float32), tf.constant(seed, tf.int64))


def graph_checks(values, context=None):
    """`tf.debugging.Assert`s of `values` (`{option name: scalar tensor}`)
    against `search_options.OPTIONS`: the same ranges and words as the
    Python checks, so that TF Serving answers InvalidArgument with
    `"<name> must be <rule>, received" <value>`. Integers are compared in
    int64, so no value wraps into range. `context`: the bounds' context
    (numbers or tensors)."""
    checks = []
    for name, value in values.items():
        option = OPTIONS[name]
        low, high = option.bounds(context)
        integer = option.dtype != "float32"
        wide = tf.cast(value, tf.int64) if integer else value
        ok = tf.constant(True)
        if not integer:
            ok &= tf.math.is_finite(value) if option.finite else ~tf.math.is_nan(value)
        if low is not None:
            ok &= (wide > low) if option.exclusive_minimum else (wide >= low)
        if high is not None:
            ok &= wide <= (tf.cast(high, wide.dtype) if tf.is_tensor(high) else high)
        checks.append(tf.debugging.Assert(
            ok, [f"{name} must be {option.rule(context)}, received", value]))
    return checks


def _check_search_options(beam_size, extra_length, vocab_size, alpha=None):
    """Python-side checks of the search options (`search_options.OPTIONS`):
    `ValueError` naming the first out of range. Those that fix shapes
    must be Python ints; `alpha` may be a tensor."""
    check_options({"beam_size": beam_size, "extra_length": extra_length},
                  {"vocabulary": vocab_size})
    check_options({"alpha": alpha}, tensors_pass=True)


def _check_matches(config, tokenizer, target_tokenizer=None):
    """`ValueError` unless the source `tokenizer` fits the model's input
    vocabulary (`config.vocab_size`) and `target_tokenizer` (default:
    `tokenizer`) its output vocabulary (`config.output_vocab_size`), both
    with the model's pad, bos and eos ids."""
    target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
    checks = [("source", tokenizer, config.vocab_size),
              ("target", target_tokenizer, config.output_vocab_size)]
    for side, tok, size in checks:
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(config, name) != getattr(tok, name):
                raise ValueError(
                    f"The model's {name} ({getattr(config, name)}) differs from the "
                    f"{side} tokenizer's ({getattr(tok, name)}): not the model's tokenizer."
                )
        if tok.vocab_size > size:
            raise ValueError(
                f"The {side} tokenizer has {tok.vocab_size} pieces but the model's "
                f"{side} vocabulary only {size}: not the model's tokenizer."
            )


def metadata_json(translator):
    return json.dumps(translator.metadata(), indent=2, sort_keys=True)


def translator_from_run_directory(run_dir, checkpoint=None, ensemble=(), **kwargs):
    """A `Translator` for a run directory's model and its source and target
    tokenizers (`RunDirectory.load_tokenizers`). `checkpoint` goes to
    `RunDirectory.load_model` unchanged (a selector or a prefix; None: its
    default). `ensemble`: more run directories (or `RunDirectory`s) whose
    models, at the same `checkpoint` selector, decode with this one as a
    `TransformerEnsemble`; their vocabularies must be the same files'
    contents (`ValueError` naming the run otherwise). `kwargs`: the
    `Translator` decoding defaults."""
    from keras_transformer.run_directory import RunDirectory

    runs = [r if isinstance(r, RunDirectory) else RunDirectory(r)
            for r in [run_dir, *ensemble]]
    source, target = runs[0].load_tokenizers()  # the same object twice when shared
    for run in runs[1:]:
        _check_same_vocabulary(runs[0], run, (source, target))
    models = [run.load_model(checkpoint=checkpoint,
                             config=run.load_config().replace(dropout=0.0))
              for run in runs]
    model = models[0] if len(models) == 1 else TransformerEnsemble(models)
    return Translator(model, source, target_tokenizer=target, **kwargs)


def _check_same_vocabulary(first, run, tokenizers):
    """`ValueError` unless `run`'s vocabularies are `first`'s
    (`tokenizers`), byte for byte: an ensemble reads every member's output
    with one tokenizer."""
    theirs = run.load_tokenizers()
    if [t.model_proto for t in theirs] != [t.model_proto for t in tokenizers]:
        raise ValueError(
            f"Ensemble member {run.path} has another vocabulary than {first.path}: "
            "train the members with one vocabulary (kt-train --vocab "
            f"{first.path}/vocab.model).")
