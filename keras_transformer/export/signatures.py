"""The translator's serving functions: tokenizers + model + search in one
`tf.Module`, strings in, strings out, as `export_translator` writes them
into a SavedModel for TF Serving. TensorFlow-only module.

`TranslatorModule` holds the model, its tokenizers and the XLA search, and
defines one `tf.function` per SavedModel signature, `signature_<name>`
(`export/engine.py` names the signatures). `export.translator.Translator`
adds the in-process engine methods over them. The functions use only core
TensorFlow and tensorflow-text ops (no `py_function`, no XLA-only ops), so
a stock `tensorflow/serving` binary runs them. One more, `translate_xla`,
runs the same search compiled by XLA on bucketed shapes (same
translations, several times faster on CPU); TF Serving runs it when
started with `--xla_cpu_compilation_enabled=true`.

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
)
from keras_transformer.export.option_checks import check_search_options, graph_checks

REPLACEMENT_CHARACTER = 0xFFFD


def _option_spec(name):
    """A scalar input of the option's dtype (`search_options.OPTIONS`)."""
    return tf.TensorSpec([], OPTIONS[name].dtype, name=name)


TEXT_SPEC = tf.TensorSpec([None], tf.string, name="text")
IDS_SPEC = tf.TensorSpec([None, None], tf.int32, name="source_ids")
LENGTHS_SPEC = tf.TensorSpec([None], tf.int32, name="source_length")
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


class TranslatorModule(tf.Module):
    """The serving functions of a `Translator` and what they share: see
    `Translator` for the arguments and the signatures' contract."""

    def __init__(self, model, tokenizer, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                 extra_length=DEFAULT_EXTRA_LENGTH, target_tokenizer=None,
                 xla_column_blocks=1, min_length=DEFAULT_MIN_LENGTH, name="translator"):
        super().__init__(name=name)
        config = model.config
        target_tokenizer = tokenizer if target_tokenizer is None else target_tokenizer
        _check_matches(config, tokenizer, target_tokenizer)
        check_search_options(beam_size, extra_length, config.output_vocab_size)
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

    @tf.function(input_signature=[IDS_SPEC, LENGTHS_SPEC, BEAM_SIZE_SPEC, ALPHA_SPEC,
                                  EXTRA_LENGTH_SPEC], autograph=False)
    def _beam_search(self, source_ids, lengths, beam_size, alpha, extra_length):
        """`beam_search_translate` of padded `source_ids` `[batch, src_len]`
        with their `lengths` `[batch]` (eos included): `(sequences [batch,
        beam, len] int32, scores [batch, beam] float32)`. One function that
        every beam signature but `translate_xla` calls (the defaults as
        constants), so the search is traced once per export and held once
        in the SavedModel. Options: Python numbers or scalar tensors of the
        specs' dtypes."""
        return beam_search_translate(
            self.model, source_ids, beam_size, alpha, extra_length, source_length=lengths,
            min_length=self.min_length)

    def _translate_tokens(self, tokens, beam_size, alpha, extra_length):
        """RaggedTensor of source tokens -> `(best ids [batch, len] int32
        (pad after the last token, eos removed), scores [batch])`."""
        source_ids, lengths, is_empty = self._source_ids(tokens)
        sequences, scores = self._beam_search(source_ids, lengths, beam_size, alpha,
                                               extra_length)
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
        sequences, scores = self._beam_search(source_ids, lengths, beam_size, alpha,
                                               extra_length)
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
        sequences, scores = self._beam_search(source_ids, lengths, beam_size, alpha,
                                               extra_length)
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

    def _xla_search(self, beam_size, alpha, extra_length):
        """An XLA-compiled `(source_ids, lengths) -> (sequences, scores)`,
        one per set of search options (they fix shapes, so they are Python
        constants). `lengths` are the sentences' own lengths, so output
        limits (and translations) do not depend on the padding."""
        check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
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
