"""The CTranslate2 engine: `CTranslate2Translator` translates with an
export directory (`export/ctranslate2.py` writes it) through
`ctranslate2.Translator` and SentencePiece, by the package's input rules
and per-sentence length limits, and `ctranslate2_translator_from_run`
converts a run directory's weights as it starts.
"""

import os
import tempfile

import numpy as np

from keras_transformer.decoding.common import check_min_length
from keras_transformer.decoding.search_options import OPTIONS, check_options
from keras_transformer.decoding.transformer_search import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EXTRA_LENGTH,
    DEFAULT_MIN_LENGTH,
)
from keras_transformer.export.ctranslate2 import (
    SentencePieceVocabulary,
    export_ctranslate2,
    import_ctranslate2,
    read_ctranslate2_metadata,
    resolve_ctranslate2_dir,
)
from keras_transformer.export.engine import TranslationEngine
from keras_transformer.export.vocabulary_map import VOCABULARY_MAP_FILE


class _Result:
    """A `ctranslate2.TranslationResult`'s hypotheses and scores."""

    __slots__ = ("hypotheses", "scores")

    def __init__(self, hypotheses, scores):
        self.hypotheses = hypotheses
        self.scores = scores


def decoding_limit(source_pieces, extra_length, max_length):
    """The most target tokens (eos included) for a source of
    `source_pieces` pieces (eos not counted): `min(source_pieces + 1 +
    extra_length, max_length)`, at least 1, the rule of the package's
    searches (`decoding.decoding_length` with the eos-terminated source
    length), given to CTranslate2 as `max_decoding_length`."""
    return max(1, min(source_pieces + 1 + extra_length, max_length))


def _ends_in_results(options):
    """Whether a search with `translate_batch` `options` shows in its
    results the step it ended at: greedy search (its one hypothesis ends
    there), and beam search at alpha > 0 with all `beam_size` hypotheses
    returned (it stops once it holds `beam_size` finished ones, the last
    ended there; at alpha 0 it stops when its best candidate is eos, which
    a better hypothesis finished earlier can hide)."""
    if options["beam_size"] == 1:
        return options.get("sampling_topk", 1) == 1
    return options["length_penalty"] > 0


class CTranslate2Translator(TranslationEngine):
    """Translates with an export directory: SentencePiece tokenizes, a
    `ctranslate2.Translator` searches, SentencePiece detokenizes. The same
    methods (`TranslationEngine`; no `explain`: the attention CTranslate2
    returns is one head's, as exported, where `explain` gives the mean over
    heads)
    and input rules as `keras_transformer.export.Translator`; None options
    are the export's defaults (`keras_transformer.json`; the paper's for an
    export that records none).

    Args:
        model_dir: a directory written by `export_ctranslate2`, or a
            directory of integer versions of them (the newest is used).
        device: "cpu" (or "cuda", "auto").
        compute_type: CTranslate2's compute type; "default" runs the model as
            it was saved (float32, or int8_float32 for an int8 export on CPU).
        intra_threads: threads per search (0: CTranslate2's default).
        inter_threads: searches that may run at once, from as many calling
            threads (CTranslate2's `inter_threads`).
        vocabulary_map: "auto" (use the export's `vmap.txt` if it has one,
            CTranslate2's `use_vmap`), "on" (it must have one) or "off".
        min_length: the fewest pieces before eos, CTranslate2's
            `min_decoding_length` (None: the export's, else 1), as the
            package's `min_length`: eos is masked before the softmax.
        output_bytes: translations as the bytes SentencePiece decodes
            (byte pieces that are not valid UTF-8 kept as they are, as the
            SavedModel's string outputs) instead of str.

    Input rules (as the package's Translator): text is decoded as UTF-8
    with invalid bytes replaced by U+FFFD; an empty or whitespace-only
    sentence gives "" and score 0.0; a source longer than `max_length - 1`
    pieces keeps its first `max_length - 1`, then eos; a translation has at
    most `decoding_limit(source pieces, extra_length, max_length)` tokens,
    eos included, per sentence, and each sentence's search is the one it
    would get alone under its limit.

    Batching: greedy search and beam search at alpha > 0 take the fast
    path, one `translate_batch` call per `batch_size` sentences (a request
    of a few sentences is one call), with a sentence that came within one
    token of its own limit searched again under that limit; sampling and
    beam search at alpha 0 go in batches of one limit each (`_search`).
    Tokenizing and detokenizing call SentencePiece's Python API, per
    sentence; no TensorFlow runs per call.

    Greedy search (`beam_size=1`, and `sample` at temperature 0) is the
    package's greedy search: the same tokens and scores (`log P`, eos
    included). A hypothesis that reaches the length limit without eos ends
    as in the package: its first `limit - 1` tokens, then eos, rescored
    with `score_batch` (CTranslate2 alone would stop it there without
    eos). Beam search differs from the package's in its rules:

    - `alpha` is CTranslate2's length penalty: a finished hypothesis scores
      `log P / length ** alpha` (length with eos), where the package uses
      GNMT's `log P / ((5 + length) / 6) ** alpha`. At alpha 0 both are
      `log P`.
    - A hypothesis finishes when eos is among the `beam_size` best
      candidates of a step (as in fairseq); the hypotheses that reach the
      length limit are the beam's survivors there, ended with eos as above
      (the package's beam also weighs eos-ended ones at the last step).
    - At alpha 0 a sentence stops when its best candidate is eos (nothing
      can beat it later), so n-best entries after the first may differ.
    - Samples come from CTranslate2's generator (`ctranslate2.set_random_seed`
      once per call): the same call gives the same samples, but a sentence's
      sample depends on its batch.
    """

    def __init__(self, model_dir, device="cpu", compute_type="default", intra_threads=0,
                 inter_threads=1, output_bytes=False, vocabulary_map="auto", min_length=None):
        import sentencepiece

        ctranslate2 = import_ctranslate2()
        self.model_dir = resolve_ctranslate2_dir(model_dir)
        self.metadata = read_ctranslate2_metadata(self.model_dir)
        from keras_transformer.config import TransformerConfig

        self.config = TransformerConfig.from_dict(self.metadata["config"])
        defaults = self.metadata.get("defaults", {})
        self.beam_size = defaults.get("beam_size", DEFAULT_BEAM_SIZE)
        self.alpha = defaults.get("alpha", DEFAULT_ALPHA)
        self.extra_length = defaults.get("extra_length", DEFAULT_EXTRA_LENGTH)
        self.min_length = defaults.get("min_length", DEFAULT_MIN_LENGTH) if min_length is None \
            else min_length
        check_min_length(self.min_length, tensor_ok=False)
        self.max_source_tokens = self.config.max_length - 1
        self._out_type = bytes if output_bytes else str
        has_map = os.path.isfile(os.path.join(self.model_dir, VOCABULARY_MAP_FILE))
        if vocabulary_map not in ("auto", "on", "off"):
            raise ValueError(f"vocabulary_map must be auto, on or off, received "
                             f"{vocabulary_map!r}.")
        if vocabulary_map == "on" and not has_map:
            raise FileNotFoundError(f"{self.model_dir} has no {VOCABULARY_MAP_FILE}: export "
                                    "with kt-export --vocabulary-map.")
        self.use_vmap = has_map and vocabulary_map != "off"

        self.source_processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(self.model_dir, self.metadata["source_sentencepiece"]))
        target = SentencePieceVocabulary.of(
            os.path.join(self.model_dir, self.metadata["target_sentencepiece"]))
        self.target_processor = target.processor
        self.target_tokens = target.tokens(self.config.output_vocab_size)
        self._target_ids = {token: i for i, token in enumerate(self.target_tokens)}
        # Ids that detokenize to nothing: bos, pad and rows past the pieces.
        self._dropped = {self.config.bos_id, self.config.pad_id}
        self._piece_count = target.piece_count
        self._ctranslate2 = ctranslate2
        self.translator = ctranslate2.Translator(
            self.model_dir, device=device, compute_type=compute_type,
            intra_threads=intra_threads, inter_threads=inter_threads)

    @property
    def compute_type(self):
        return self.translator.compute_type

    # Text <-> pieces -----------------------------------------------------------

    def source_pieces(self, sentence):
        """`sentence` (str or bytes) -> its source pieces, truncated to
        `max_source_tokens` (eos is CTranslate2's to add); `[]` when blank."""
        if isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8", "replace")
        if not sentence.strip():
            return []
        return self.source_processor.encode(sentence, out_type=str)[: self.max_source_tokens]

    def detokenize(self, tokens):
        """CTranslate2's output tokens (eos removed) -> text."""
        ids = [self._target_ids[t] for t in tokens]
        ids = [i for i in ids if i not in self._dropped and i < self._piece_count]
        return self.target_processor.decode(ids, out_type=self._out_type)

    # Searches --------------------------------------------------------------------

    def _search(self, sentences, extra_length, batch_size, options):
        """Runs `translate_batch(**options)` over `sentences`; returns the
        results in input order (None for blank sentences), each as if its
        sentence were searched alone under its own length limit
        (`decoding_limit`), where CTranslate2 takes one limit per batch.

        The fast path, for the searches whose results show the step they
        ended at (`_ends_in_results`: greedy search, and beam search at
        alpha > 0): the sentences, sorted by length, go in batches of
        `batch_size` under their batch's largest limit, one
        `translate_batch` call each. A sentence whose hypotheses all end two
        or more tokens before its own limit is settled: its search never
        reached its own last step, where the two limits first differ.
        Otherwise (sampling, beam search at alpha 0, and the few sentences
        the fast path leaves unsettled) the sentences go in batches of one
        limit each."""
        extra_length = self.extra_length if extra_length is None else extra_length
        OPTIONS["extra_length"].check(extra_length)
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, received {batch_size}.")
        pieces = [self.source_pieces(s) for s in sentences]
        max_length = self.config.max_length
        limits = {i: decoding_limit(len(p), extra_length, max_length)
                  for i, p in enumerate(pieces) if p}
        results = [None] * len(sentences)
        unsettled = list(limits)
        if _ends_in_results(options):
            # A limit at or below min_length lowers min_decoding_length.
            fast = sorted((i for i in unsettled if limits[i] > self.min_length),
                          key=lambda i: len(pieces[i]))
            unsettled = [i for i in unsettled if limits[i] <= self.min_length]
            unsettled += self._search_fast(pieces, limits, fast, batch_size, options,
                                           results)
        by_limit = {}
        for i in unsettled:
            by_limit.setdefault(limits[i], []).append(i)
        alpha = options.get("length_penalty", 0.0)
        for limit, indices in sorted(by_limit.items()):
            for start in range(0, len(indices), batch_size):
                chunk = indices[start:start + batch_size]
                out = self._translate_batch([pieces[i] for i in chunk], limit,
                                            min(self.min_length, limit - 1), options)
                for i, result in zip(chunk, out):
                    results[i] = self._ended_with_eos(pieces[i], result, limit, alpha)
        return results

    def _search_fast(self, pieces, limits, indices, batch_size, options, results):
        """`_search`'s fast path over `indices` (sorted by length, each
        limit above `min_length`): fills `results` for the settled ones,
        returns the others. A beam search returns all its finished
        hypotheses (it stops holding `beam_size` of them), so the longest
        is the one of the step it ended at."""
        wanted = options["num_hypotheses"]
        every = dict(options, num_hypotheses=options["beam_size"])
        unsettled = []
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            out = self._translate_batch([pieces[i] for i in chunk],
                                        max(limits[i] for i in chunk), self.min_length, every)
            for i, result in zip(chunk, out):
                hypotheses = result.hypotheses
                if max(map(len, hypotheses)) + 2 > limits[i]:
                    unsettled.append(i)
                elif len(hypotheses) > wanted:
                    results[i] = _Result(hypotheses[:wanted], result.scores[:wanted])
                else:
                    results[i] = result
        return unsettled

    def _translate_batch(self, batch, limit, min_length, options):
        # CTranslate2 masks eos before the softmax, as the package's
        # `forbid_early_eos`.
        return self.translator.translate_batch(
            batch, max_decoding_length=limit, min_decoding_length=min_length,
            max_input_length=0, return_scores=True, use_vmap=self.use_vmap, **options)

    def _ended_with_eos(self, source, result, limit, alpha):
        """`result` with each hypothesis that reached `limit` tokens without
        eos ending as the package's searches end it: its first `limit - 1`
        tokens, then eos, scored by their teacher-forced log P (eos
        included) over `limit ** alpha`; the hypotheses re-sorted by score.
        CTranslate2 stops such a hypothesis without eos."""
        cut = [i for i, h in enumerate(result.hypotheses) if len(h) >= limit]
        if not cut:
            return result
        hypotheses = [list(h) for h in result.hypotheses]
        scores = list(result.scores)
        forced = self.translator.score_batch(
            [list(source)] * len(cut), [hypotheses[i][:limit - 1] for i in cut],
            max_input_length=0)
        for i, scored in zip(cut, forced):
            hypotheses[i] = hypotheses[i][:limit - 1]
            scores[i] = float(np.sum(scored.log_probs, dtype=np.float64)) / limit ** alpha
        order = sorted(range(len(scores)), key=lambda k: -scores[k])
        return _Result([hypotheses[k] for k in order], [scores[k] for k in order])

    def _options(self, beam_size, alpha):
        beam_size = self.beam_size if beam_size is None else beam_size
        alpha = self.alpha if alpha is None else alpha
        check_options({"beam_size": beam_size, "alpha": alpha},
                      {"vocabulary": self.config.output_vocab_size})
        return int(beam_size), float(alpha)

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None,
                  batch_size=32):
        """Beam search (greedy at `beam_size=1`): `(translations: list of
        str, scores: list of float)`, the scores `log P / length ** alpha`."""
        beam_size, alpha = self._options(beam_size, alpha)
        return self._best(self._search(sentences, extra_length, batch_size, dict(
            beam_size=beam_size, length_penalty=alpha, num_hypotheses=1)))

    def _best(self, results):
        """`(translations, scores)` of `_search`'s results' first
        hypotheses ("" and 0.0 for a blank sentence)."""
        translations, scores = [], []
        for result in results:
            if result is None:
                translations.append(self._out_type())
                scores.append(0.0)
            else:
                translations.append(self.detokenize(result.hypotheses[0]))
                scores.append(float(result.scores[0]))
        return translations, scores

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None,
                        batch_size=32):
        """The `n` best hypotheses of each sentence, best first: a list per
        sentence of `n` `(translation, score)` pairs (`("", 0.0)` for a blank
        sentence). Needs `1 <= n <= beam_size` (default beam: `max(n, the
        export's)`)."""
        if beam_size is None:
            beam_size = max(int(n), self.beam_size)
        beam_size, alpha = self._options(beam_size, alpha)
        OPTIONS["n"].check(n, {"beam_size": beam_size})
        results = self._search(sentences, extra_length, batch_size, dict(
            beam_size=beam_size, length_penalty=alpha, num_hypotheses=n))
        out = []
        for result in results:
            if result is None:
                out.append([(self._out_type(), 0.0)] * n)
                continue
            out.append([(self.detokenize(h), float(s))
                        for h, s in zip(result.hypotheses, result.scores)])
        return out

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None, batch_size=32):
        """One sample per sentence: `(translations, scores)`, the scores the
        model's untempered log P of the sampled tokens. `temperature` 0 is
        greedy; `top_k` 0 samples from the whole vocabulary; `top_p` in
        (0, 1]. `seed` seeds CTranslate2's generator only in threads that
        have not drawn from it yet (OpenNMT/CTranslate2#1757): unlike the
        SavedModel's, these samples differ from call to call."""
        check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                       "seed": seed})
        self._ctranslate2.set_random_seed(int(seed) % 2**32)
        options = dict(beam_size=1, length_penalty=0.0, num_hypotheses=1,
                       sampling_topk=1 if temperature == 0 else int(top_k),
                       sampling_topp=float(top_p),
                       sampling_temperature=float(temperature) if temperature else 1.0)
        return self._best(self._search(sentences, extra_length, batch_size, options))

    def score(self, sources, targets, batch_size=32):
        """Teacher-forced log-probabilities: for each `(source, target)` pair
        of piece lists (no eos), a float32 array of `len(target) + 1` values,
        the log P of each target piece and of eos, given bos and the source
        (eos appended)."""
        out = self.translator.score_batch(
            [list(s) for s in sources], [list(t) for t in targets],
            max_batch_size=batch_size, max_input_length=0)
        return [np.asarray(result.log_probs, np.float32) for result in out]


def ctranslate2_translator_from_run(run_dir, checkpoint=None, compute_type="default",
                                    intra_threads=0, beam_size=None, alpha=None,
                                    extra_length=None, min_length=None):
    """A `CTranslate2Translator` for a run directory's weights, converted
    now: the checkpoint `checkpoint` selects (`RunDirectory.resolve_checkpoint`)
    is exported in float32 to a temporary directory, loaded and the
    directory removed (CTranslate2 and SentencePiece hold the model in
    memory once loaded). `compute_type` "int8" quantizes as it loads, which
    gives the weights of `kt-export --quantization int8`.

    Args:
        run_dir: a run directory (or a `RunDirectory`).
        checkpoint: a `--checkpoint` selector or prefix (default "auto").
        compute_type, intra_threads: `CTranslate2Translator`'s.
        beam_size, alpha, extra_length, min_length: search defaults (None:
            the package's, `keras_transformer.decoding`); `alpha` is
            CTranslate2's length penalty.

    Returns: `(translator, reason)`, `reason` the checkpoint and why it was
    chosen, as `kt-export` prints it.
    """
    from keras_transformer.run_directory import RunDirectory
    from keras_transformer.training.checkpoints import averaged_if_asked

    import_ctranslate2()
    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
    prefix, reason = run.resolve_checkpoint(averaged_if_asked(run, checkpoint))
    model = run.load_model(prefix, quiet=True)
    source, target = run.load_tokenizers()
    with tempfile.TemporaryDirectory(prefix="kt-ctranslate2-") as tmp:
        path = export_ctranslate2(
            model, source, target, os.path.join(tmp, "model"),
            beam_size=DEFAULT_BEAM_SIZE if beam_size is None else beam_size,
            alpha=DEFAULT_ALPHA if alpha is None else alpha,
            extra_length=DEFAULT_EXTRA_LENGTH if extra_length is None else extra_length,
            min_length=DEFAULT_MIN_LENGTH if min_length is None else min_length)
        translator = CTranslate2Translator(path, compute_type=compute_type,
                                           intra_threads=intra_threads)
    return translator, reason
