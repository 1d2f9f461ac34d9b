"""The translation engine contract, and the names of an exported
translator's signatures, defined once.

Four engines translate with the same methods and the same defaults:
`Translator` (a model in process), `SavedModelTranslator` (an export loaded
back), `CTranslate2Translator` (a CTranslate2 export) and `RestClient` (a
model server). Each inherits `TranslationEngine`; those that can explain a
translation, `ExplainingEngine`. An option left None is the engine's default:
the defaults the model was exported (or built) with, which are the paper's
(`keras_transformer.decoding.DEFAULT_BEAM_SIZE`, `DEFAULT_ALPHA`,
`DEFAULT_EXTRA_LENGTH`: beam 4, alpha 0.6, extra length 50) unless the export
says otherwise. An engine may take further keyword options after these (a
batch size, XLA), each with a default.

A SavedModel written by `export_translator` has the signatures `SIGNATURES`,
named by the constants below; code refers to a signature by its constant.
"""

import abc

SERVING_DEFAULT = "serving_default"
TRANSLATE_WITH_OPTIONS = "translate_with_options"
TRANSLATE_IDS = "translate_ids"
TRANSLATE_XLA = "translate_xla"
TRANSLATE_NBEST = "translate_nbest"
TRANSLATE_SAMPLE = "translate_sample"
TRANSLATE_EXPLAIN = "translate_explain"
# Every signature of an export, in the order `Translator.signatures()` lists them.
SIGNATURES = (SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS, TRANSLATE_IDS, TRANSLATE_XLA,
              TRANSLATE_NBEST, TRANSLATE_SAMPLE, TRANSLATE_EXPLAIN)


class TranslationEngine(abc.ABC):
    """Translates lists of sentences (`str`, or UTF-8 `bytes`) under the
    package's input rules: every sentence gets an answer, an empty or
    whitespace-only one the empty translation with score 0.0, and invalid
    UTF-8 is read as U+FFFD. Answers are in the input order."""

    @abc.abstractmethod
    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """Beam search (greedy at `beam_size=1`).

        Args:
            sentences: list of source sentences.
            beam_size: int >= 1; None: the engine's default.
            alpha: float, the length-penalty exponent; None: the default.
            extra_length: int >= 0, output tokens allowed beyond the
                source's; None: the default.

        Returns: `(translations: list of str, scores: list of float)`.
        """

    @abc.abstractmethod
    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None):
        """The `n` best hypotheses of beam search.

        Args:
            sentences: list of source sentences.
            n: int, `1 <= n <= beam_size`.
            beam_size: None: `max(n, the engine's default)`.
            alpha, extra_length: None: the engine's defaults.

        Returns: a list per sentence of `n` `(translation str, score
        float)` pairs, best first (a blank sentence: `n` times `("",
        0.0)`).
        """

    @abc.abstractmethod
    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None):
        """One sampled translation per sentence.

        Args:
            sentences: list of source sentences.
            temperature: float >= 0; 0 is greedy search.
            top_k: int >= 0; 0: no top-k cut.
            top_p: float in `(0, 1]`; 1.0: no nucleus cut.
            seed: int; the same seed, the same samples.
            extra_length: None: the engine's default.

        Returns: `(translations: list of str, scores: list of float)`, the
        scores the model's untempered log-probabilities of the sampled
        tokens.
        """


class ExplainingEngine(TranslationEngine):
    """A `TranslationEngine` that also explains its translations with the
    model's own probabilities and cross-attention (the `translate_explain`
    signature's outputs)."""

    @abc.abstractmethod
    def explain(self, sentences, beam_size=None, alpha=None, extra_length=None):
        """Translates as `translate` and explains each translation.

        Returns: a list, per sentence, of dicts: `translation` (str) and
        `score` (float), `translate`'s with the same options;
        `source_pieces` (S str, eos last), `target_pieces` (T str),
        `token_log_probs` (T floats), `alignment` (T lists of S floats, row
        t the last decoder layer's cross-attention, mean over heads, while
        predicting target piece t).
        """
