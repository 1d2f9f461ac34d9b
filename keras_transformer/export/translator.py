"""`Translator`: a model with its tokenizers and searches, strings in,
strings out, in-process (`translate`, `translate_nbest`, `sample`,
`explain`: the engine contract of `export/engine.py`) over the serving
functions of `export/signatures.py`, which `export_translator` writes as a
SavedModel. The input rules are the serving functions' (see there).
TensorFlow-only module.
"""

import tensorflow as tf

from keras_transformer.export.batches import (
    explain_in_batches,
    nbest_in_batches,
    translate_in_batches,
)
from keras_transformer.export.engine import (
    ExplainingEngine,
)
from keras_transformer.export.option_checks import (
    check_search_options,
    nbest_beam_size,
    sampling_options,
)
from keras_transformer.export.signatures import TEST_SET_LENGTH_BUCKET, TranslatorModule


class Translator(TranslatorModule, ExplainingEngine):
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

    Options outside their ranges (`decoding.search_options.OPTIONS`) fail
    the whole request with `InvalidArgumentError` naming the option, in the
    graph: TF Serving answers them with a 400 too. The methods refuse them
    first with a `ValueError` in the same words.

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
        check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
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
        check_search_options(1, extra_length, self.config.output_vocab_size)
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
        check_search_options(beam_size, extra_length, self.config.output_vocab_size, alpha)
        return (tf.constant(beam_size, tf.int32), tf.constant(alpha, tf.float32),
                tf.constant(extra_length, tf.int32))
