"""A CTranslate2 export served by kt-serve: the SavedModel's signatures,
inputs, outputs and refusals, answered by CTranslate2's engine
(`export.ctranslate2_translator.CTranslate2Translator`).

A version directory holding `model.bin` and `keras_transformer.json`
(`kt-export --format ctranslate2`) is a CTranslate2 version
(`is_ctranslate2_version`). Its signatures, with the SavedModel's input and
output names, dtypes and shapes (`SPECS`; a test holds them to the
SavedModel's):

- `serving_default`: text -> translation, score (the export's defaults).
- `translate_with_options`: text, beam_size, alpha, extra_length ->
  translation, score.
- `translate_nbest`: text, n, beam_size, alpha, extra_length ->
  translations `[batch, n]`, scores `[batch, n]`.
- `translate_sample`: text, temperature, top_k, top_p, seed, extra_length ->
  translation, score.

Options outside the ranges of `decoding.search_options.OPTIONS` are refused
with the SavedModel's messages (`ModelError`, HTTP 400).

What differs from the SavedModel: `alpha` is CTranslate2's length penalty
(`log P / length ** alpha`; the SavedModel's is GNMT's), so beam scores
agree with the SavedModel's only at alpha 0 and greedy; and there is no
`translate_explain`: CTranslate2's `return_attention` gives the attention
of one head of the last decoder layer as exported, where the SavedModel's
alignment is the mean over heads, so the playground shows translations,
n-best lists and scores without the alignment view.
"""

import json
import os

import numpy as np

from keras_transformer.decoding.search_options import OPTIONS, assertion_failure
from keras_transformer.export.engine import (
    SERVING_DEFAULT,
    TRANSLATE_NBEST,
    TRANSLATE_SAMPLE,
    TRANSLATE_WITH_OPTIONS,
)
from keras_transformer.serving.model_versions import (  # noqa: F401  (is_ctranslate2_version: this module's too)
    WARM_UP_SENTENCE,
    ModelError,
    is_ctranslate2_version,
    load_servable,
)
from keras_transformer.serving.rest_api import SignatureSpec, TensorSpec

EXAMPLES_FILE = "examples.json"

_TEXT = TensorSpec("string", (None,))
_SCORE = TensorSpec("float32", (None,))
_BEST = {"translation": _TEXT, "score": _SCORE}


def _option(name):
    return TensorSpec(OPTIONS[name].dtype, ())


_SEARCH = {name: _option(name) for name in ("beam_size", "alpha", "extra_length")}
SPECS = {
    SERVING_DEFAULT: SignatureSpec({"text": _TEXT}, _BEST),
    TRANSLATE_WITH_OPTIONS: SignatureSpec({"text": _TEXT, **_SEARCH}, _BEST),
    TRANSLATE_NBEST: SignatureSpec(
        {"text": _TEXT, "n": _option("n"), **_SEARCH},
        {"translations": TensorSpec("string", (None, None)),
         "scores": TensorSpec("float32", (None, None))}),
    TRANSLATE_SAMPLE: SignatureSpec(
        {"text": _TEXT, **{name: _option(name) for name in
                           ("temperature", "top_k", "top_p", "seed", "extra_length")}},
        _BEST),
}


class CTranslate2Servable:
    """One CTranslate2 version, with `model_versions.Servable`'s interface
    (`version`, `path`, `specs`, `metadata`, `examples`, `predict`,
    `warm_up`).

    Args:
        path: the version directory.
        version: its number.
        compute_type: CTranslate2's ("default": as exported, int8_float32
            for an int8 export on CPU).
        intra_threads: threads per search.
        inter_threads: searches that run at once (kt-serve's
            --num-batch-threads or its worker threads call `predict`
            concurrently; each call takes one).
        vocabulary_map: "auto", "on" or "off": whether to use the export's
            `vmap.txt` (`CTranslate2Translator`).
    """

    engine = "ctranslate2"

    def __init__(self, path, version, compute_type="default", intra_threads=1,
                 inter_threads=1, vocabulary_map="auto"):
        from keras_transformer.export.ctranslate2_translator import CTranslate2Translator

        self.version = version
        self.path = path
        self.translator = CTranslate2Translator(path, compute_type=compute_type,
                                                intra_threads=intra_threads,
                                                inter_threads=inter_threads,
                                                output_bytes=True,
                                                vocabulary_map=vocabulary_map)
        self.specs = dict(SPECS)
        self.vocab_size = self.translator.config.output_vocab_size
        self.metadata = {"beam_size": self.translator.beam_size,
                         "alpha": self.translator.alpha,
                         "extra_length": self.translator.extra_length,
                         "max_source_tokens": self.translator.max_source_tokens,
                         "max_length": self.translator.config.max_length,
                         "output_vocab_size": self.vocab_size,
                         "engine": self.engine,
                         "compute_type": self.translator.compute_type,
                         "vocabulary_map": self.translator.use_vmap}
        examples = os.path.join(path, EXAMPLES_FILE)
        self.examples = []
        if os.path.isfile(examples):
            with open(examples, encoding="utf-8") as f:
                self.examples = [str(e) for e in json.load(f)]

    def warm_up(self, request_limits=None):
        """One translation of a short sentence, at the export's defaults:
        within any `request_limits` kt-serve accepts. Returns 1
        (requests)."""
        self.translator.translate([WARM_UP_SENTENCE])
        return 1

    def predict(self, signature, inputs):
        """Runs `signature` on `inputs` (`{name: np.ndarray}` matching
        `SPECS`). Blocks; thread-safe.

        Returns: `{output name: np.ndarray}` (strings as UTF-8 bytes).
        Raises: `ModelError` for options out of range.
        """
        failure = assertion_failure({name: value for name, value in inputs.items()
                                     if name != "text"}, {"vocabulary": self.vocab_size})
        if failure is not None:
            raise ModelError(failure)
        text = inputs["text"].tolist()  # bytes: the translator decodes them as UTF-8
        options = {name: value.item() for name, value in inputs.items() if name != "text"}
        if "extra_length" in options:
            options["extra_length"] = min(options["extra_length"],
                                          self.translator.config.max_length)
        translator = self.translator
        if signature == SERVING_DEFAULT:
            return _best(*translator.translate(text))
        if signature == TRANSLATE_WITH_OPTIONS:
            return _best(*translator.translate(text, **options))
        if signature == TRANSLATE_NBEST:
            n = options["n"]
            nbest = translator.translate_nbest(text, **options)
            return {"translations": np.array([[t for t, _ in row] for row in nbest],
                                             object).reshape(len(text), n),
                    "scores": np.array([[s for _, s in row] for row in nbest],
                                       np.float32).reshape(len(text), n)}
        if signature == TRANSLATE_SAMPLE:
            return _best(*translator.sample(text, **options))
        raise ModelError(f"Serving signature name: \"{signature}\" not found")


def _best(translations, scores):
    return {"translation": np.array(translations, object),
            "score": np.array(scores, np.float32)}


def load_ctranslate2_servable(path, version, compute_type="default", intra_threads=1,
                              inter_threads=1, vocabulary_map="auto", request_limits=None):
    """Loads and warms up the CTranslate2 version at `path`
    (`model_versions.load_servable` with a `CTranslate2Servable`)."""
    def make(path, version):
        return CTranslate2Servable(path, version, compute_type, intra_threads, inter_threads,
                                   vocabulary_map)

    return load_servable(path, version, make, request_limits)
