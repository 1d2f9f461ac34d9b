"""`LiteRTTranslator`: a LiteRT export (`export/litert.py`) run through
the LiteRT interpreter, as an engine of the package's contract
(`export/engine.py`).

The interpreter is `ai_edge_litert`'s when the `litert` extra is installed
(`pip install attention-transformer-keras[litert]`), else TensorFlow's own
`tf.lite` one; both get tensorflow-text's LiteRT kernels
(`tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`) for the Fast
SentencePiece ops.
"""

import os
import threading

import numpy as np

from keras_transformer.decoding.search_options import check_options
from keras_transformer.export.engine import (
    SERVING_DEFAULT,
    TRANSLATE_WITH_OPTIONS,
    TranslationEngine,
)

METADATA_FILE = "keras_transformer_litert.json"
MODEL_FILE = "model.tflite"
ASCII_WHITESPACE = " \t\n\v\f\r"


def resolve_litert_dir(path):
    """`path` itself if it is a LiteRT export directory, else its newest
    integer version directory that is one (`<name>_litert/<version>/`, the
    layout kt-export writes); `FileNotFoundError` naming `path` when
    neither."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, METADATA_FILE)):
        return path
    numbers = sorted(int(n) for n in os.listdir(path) if n.isdigit()
                     and os.path.isfile(os.path.join(path, n, METADATA_FILE))) \
        if os.path.isdir(path) else []
    if not numbers:
        raise FileNotFoundError(f"{path}: not a LiteRT export of this package (no "
                                f"{METADATA_FILE}; write one with kt-export --format litert).")
    return os.path.join(path, str(numbers[-1]))


def read_metadata(path):
    """The export's `keras_transformer_litert.json` (of `path` or its
    newest version, `resolve_litert_dir`) as a dict."""
    import json

    with open(os.path.join(resolve_litert_dir(path), METADATA_FILE), encoding="utf-8") as f:
        return json.load(f)


def make_interpreter(model_path, threads=1):
    """A LiteRT interpreter of `model_path` with tensorflow-text's kernels
    registered: `ai_edge_litert`'s if installed, else `tf.lite`'s."""
    import tensorflow_text

    try:
        from ai_edge_litert.interpreter import InterpreterWithCustomOps
    except ImportError:
        from tensorflow.lite.python.interpreter import InterpreterWithCustomOps
    return InterpreterWithCustomOps(
        model_path=model_path, num_threads=threads,
        custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS)


class LiteRTTranslator(TranslationEngine):
    """Translates with a LiteRT export, one sentence per interpreter call,
    under the package's input rules: a blank sentence gives "" and score
    0.0, invalid UTF-8 is read (and written) as U+FFFD.

    Args:
        path: the export directory, or `<name>_litert/` (its newest version).
        threads: the interpreter's CPU threads.

    Only `translate` (the file's two signatures): `translate_nbest` and
    `sample` raise `ValueError` saying which engine has them. Safe to call
    from several threads: an interpreter takes one call at a time (a lock).

    Example:
    >>> translator = LiteRTTranslator(litert_dir)  # kt-export --format litert
    >>> translator.translate(["a cat sits on the mat", "  "])[0][1]
    ''
    """

    def __init__(self, path, threads=1):
        import sentencepiece

        self.path = resolve_litert_dir(path)
        self.metadata = read_metadata(self.path)
        defaults = self.metadata["defaults"]
        self.beam_size, self.alpha = defaults["beam_size"], defaults["alpha"]
        self.extra_length = defaults["extra_length"]
        self.tokenize_in_model = self.metadata["tokenization"] == "in_model"
        self._source = None
        if not self.tokenize_in_model:
            self._source = sentencepiece.SentencePieceProcessor(
                model_file=os.path.join(self.path, self.metadata["source_vocabulary"]))
        self._interpreter = make_interpreter(os.path.join(self.path, MODEL_FILE), threads)
        self._runners = {name: self._interpreter.get_signature_runner(name)
                         for name in (SERVING_DEFAULT, TRANSLATE_WITH_OPTIONS)}
        self._lock = threading.Lock()

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None,
                  batch_size=None):
        """Beam search: `(translations: list of str, scores: list of
        float)`, the SavedModel's for a float32 export. Options out of range
        raise `ValueError` with the SavedModel's words. `batch_size` is
        taken for the engines' common calls and changes nothing: the file
        translates one sentence per call."""
        options = {"beam_size": beam_size, "alpha": alpha, "extra_length": extra_length}
        check_options(options, {"vocabulary": self.metadata["target_vocab_size"]})
        given = {name: value for name, value in options.items() if value is not None}
        if given:
            runner = self._runners[TRANSLATE_WITH_OPTIONS]
            values = {"beam_size": self.beam_size, "alpha": self.alpha,
                      "extra_length": self.extra_length, **given}
            arguments = {"beam_size": np.array(int(values["beam_size"]), np.int32),
                         "alpha": np.array(float(values["alpha"]), np.float32),
                         "extra_length": np.array(int(values["extra_length"]), np.int32)}
        else:
            runner, arguments = self._runners[SERVING_DEFAULT], {}
        translations, scores = [], []
        for sentence in sentences:
            translation, score = self._one(runner, arguments, sentence)
            translations.append(translation)
            scores.append(score)
        return translations, scores

    def _one(self, runner, arguments, sentence):
        if isinstance(sentence, bytes):
            sentence = sentence.decode("utf-8", "replace")
        if not sentence.strip(ASCII_WHITESPACE):  # as tf.strings.strip
            return "", 0.0
        if self.tokenize_in_model:
            source = {"text": np.array([sentence.encode("utf-8")], object)}
        else:
            source = {"source_ids": np.array([self._source.encode(sentence)], np.int32)}
        with self._lock:
            out = runner(**source, **arguments)
            translation, score = out["translation"][0], float(out["score"][0])
        return translation.decode("utf-8", "replace"), score

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None):
        raise ValueError("A LiteRT export has serving_default and translate_with_options; "
                         "n-best lists need the SavedModel or CTranslate2 engine.")

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None):
        raise ValueError("A LiteRT export has serving_default and translate_with_options; "
                         "sampling needs the SavedModel or CTranslate2 engine.")
