"""SavedModel export in the layout TF Serving watches, and loading it back.
TensorFlow-only module.

Layout::

    <output_dir>/<name>/<version>/      version = 1, 2, 3, ... (next integer)
        saved_model.pb                  signatures: serving_default,
        variables/                        translate_with_options, translate_ids,
                                          translate_xla, translate_nbest,
                                          translate_sample, translate_explain
                                          (see `Translator`)
        assets.extra/translator.json    config, decoding defaults, input rules
        assets.extra/examples.json      example source sentences (optional; the
                                          playground of kt-serve offers them)
        assets.extra/tf_serving_warmup_requests
                                        warm-up requests TF Serving and kt-serve
                                          replay on load (`export/warmup.py`)

The version directory is written under a temporary name in `<output_dir>`
(outside the `<name>/` directory a server watches) and renamed into place,
so a server never sees half a model. The version directory gets the mode the
umask gives a new directory (0755 under umask 022), so TF Serving running
under another uid can read it.
"""

import json
import os
import re
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.decoding.ensemble import TransformerEnsemble
from keras_transformer.export.batches import (
    explain_in_batches,
    nbest_in_batches,
    translate_in_batches,
)
from keras_transformer.export.engine import (
    SERVING_DEFAULT,
    TRANSLATE_EXPLAIN,
    TRANSLATE_NBEST,
    TRANSLATE_SAMPLE,
    TRANSLATE_WITH_OPTIONS,
    TRANSLATE_XLA,
    ExplainingEngine,
)
from keras_transformer.export.option_checks import nbest_beam_size, sampling_options
from keras_transformer.export.warmup import WARMUP_PATH, warmup_requests, write_warmup_file
from keras_transformer.files import fsync_directory, honour_umask
from keras_transformer.tokenizer import sentencepiece_ids

METADATA_FILE = os.path.join("assets.extra", "translator.json")
EXAMPLES_FILE = os.path.join("assets.extra", "examples.json")


def versions(model_dir):
    """The integer version directories under `model_dir`, sorted."""
    if not os.path.isdir(model_dir):
        return []
    return sorted(
        int(entry) for entry in os.listdir(model_dir)
        if re.fullmatch(r"[0-9]+", entry) and os.path.isdir(os.path.join(model_dir, entry))
    )


def export_translator(translator, output_dir="saved_models", name="transformer",
                      version=None, examples=None):
    """Writes `translator` as `<output_dir>/<name>/<version>/` atomically.

    Args:
        translator: a `Translator`.
        output_dir: the directory a TF Serving model config points into.
        name: the model name (TF Serving's `MODEL_NAME`).
        version: an int; default one more than the largest existing.
        examples: optional list of source sentences (str), e.g. held-out
            ones, written to `assets.extra/examples.json` for a server's
            playground to offer; the shortest is the warm-up sentence.

    The version directory also gets TF Serving's warm-up file,
    `assets.extra/tf_serving_warmup_requests` (`export/warmup.py`): one
    request per signature of `warmup.WARMUP_SIGNATURES`, on the shortest
    example sentence (or `warmup.WARMUP_SENTENCE`), with the export's
    defaults.

    Returns: the path of the new version directory.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(
            f"`name` must be letters, digits, '_', '.', '-', received {name!r}."
        )
    if isinstance(getattr(translator, "model", None), TransformerEnsemble):
        raise ValueError("An ensemble is not exported: export one member, or one model "
                         "whose weights are the members' average (kt-average).")
    model_dir = os.path.join(os.path.abspath(output_dir), name)
    os.makedirs(model_dir, exist_ok=True)
    if version is None:
        version = (versions(model_dir) or [0])[-1] + 1
    if not isinstance(version, int) or version < 0:
        raise ValueError(f"`version` must be a non-negative int, received {version!r}.")
    final = os.path.join(model_dir, str(version))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists; versions are never overwritten.")
    tmp = tempfile.mkdtemp(dir=os.path.dirname(model_dir), prefix=f".tmp-{name}-{version}-")
    try:
        # The serving functions are traced in inference mode, which has no
        # custom gradient (layers/layer_norm.py), so no gradient function is
        # saved and loading does not warn about unsaved ones (tested).
        tf.saved_model.save(translator, tmp, signatures=translator.signatures())
        os.makedirs(os.path.join(tmp, "assets.extra"), exist_ok=True)
        with open(os.path.join(tmp, METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(translator.metadata(), f, indent=2, sort_keys=True)
        if examples is not None:
            with open(os.path.join(tmp, EXAMPLES_FILE), "w", encoding="utf-8") as f:
                json.dump([str(e) for e in examples], f, ensure_ascii=False, indent=0)
        write_warmup_file(os.path.join(tmp, WARMUP_PATH),
                          _warmup_requests(translator, examples), model_name=name)
        honour_umask(tmp)  # mkdtemp's 0700 would keep TF Serving under another uid out
        os.rename(tmp, final)  # fails if another export took this version
        fsync_directory(model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _warmup_requests(translator, examples):
    """`warmup.warmup_requests` of `translator`'s signatures. The source ids
    of `translate_ids` come from SentencePiece in Python, with the source
    vocabulary's model proto: the tokenizer's eager TensorFlow resource may
    be gone (seeding destroys it)."""
    tokenizer = getattr(translator, "tokenizer", None)
    tokenize = None
    if tokenizer is not None:
        processor, _ = sentencepiece_ids(tokenizer.model_proto)
        tokenize = processor.encode
    return warmup_requests(translator.signatures(), translator.metadata(),
                           examples=examples, tokenize=tokenize)


def read_metadata(path):
    """`assets.extra/translator.json` of an exported version directory."""
    with open(os.path.join(path, METADATA_FILE), encoding="utf-8") as f:
        return json.load(f)


def read_examples(path):
    """The example sentences of an exported version directory (`[]` if it
    has none)."""
    try:
        with open(os.path.join(path, EXAMPLES_FILE), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return []


def resolve_version(path):
    """`path` itself if it holds a `saved_model.pb`, else its newest integer
    version subdirectory (so `saved_models/<name>` works too)."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    found = versions(path)
    if not found:
        raise FileNotFoundError(
            f"No SavedModel at {path}: expected saved_model.pb or <version>/saved_model.pb."
        )
    return os.path.join(path, str(found[-1]))


class SavedModelTranslator(ExplainingEngine):
    """An exported translator loaded back (needs only TensorFlow and
    tensorflow-text), with `Translator`'s `translate`, `translate_nbest`,
    `sample` and `explain` (through the `translate_nbest`, `translate_sample`
    and `translate_explain` signatures); None options are the export's
    defaults (`assets.extra/translator.json`)."""

    def __init__(self, path):
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        self.path = resolve_version(path)
        self.loaded = tf.saved_model.load(self.path)
        self.metadata = read_metadata(self.path)

    def translate(self, sentences, beam_size=None, alpha=None, extra_length=None,
                  batch_size=32, jit_compile=False):
        """As `Translator.translate`: `(list of str, list of float)`.
        `jit_compile`: use the `translate_xla` signature (same translations,
        faster) when no option differs from the export's defaults."""
        m = self.metadata
        defaults = (beam_size in (None, m["beam_size"]) and alpha in (None, m["alpha"])
                    and extra_length in (None, m["extra_length"]))
        if jit_compile and defaults:
            if TRANSLATE_XLA not in self.loaded.signatures:
                raise ValueError(
                    f"{self.path} has no {TRANSLATE_XLA} signature (exported before it "
                    "existed): export it again, or translate without XLA (--no-xla).")
            name, options = TRANSLATE_XLA, {}
        elif beam_size is None and alpha is None and extra_length is None:
            name, options = SERVING_DEFAULT, {}
        else:
            name = TRANSLATE_WITH_OPTIONS
            options = self._search_options(beam_size, alpha, extra_length)
        serve = self.loaded.signatures[name]

        def run(batch):
            return serve(text=batch, **options)

        return translate_in_batches(run, sentences, batch_size)

    def translate_nbest(self, sentences, n, beam_size=None, alpha=None, extra_length=None,
                        batch_size=32):
        """As `Translator.translate_nbest` (defaults: the export's): a list
        per sentence of `n` `(str, float)` pairs, best first."""
        serve = self._signature(TRANSLATE_NBEST)
        beam_size = nbest_beam_size(n, beam_size, self.metadata["beam_size"])
        options = dict(n=tf.constant(n, tf.int32),
                       **self._search_options(beam_size, alpha, extra_length))
        return nbest_in_batches(lambda batch: serve(text=batch, **options), sentences,
                                batch_size)

    def sample(self, sentences, temperature=1.0, top_k=0, top_p=1.0, seed=0,
               extra_length=None, batch_size=32):
        """As `Translator.sample`: `(list of str, list of float)`, the same
        samples for the same seed."""
        serve = self._signature(TRANSLATE_SAMPLE)
        temperature, top_k, top_p, seed = sampling_options(temperature, top_k, top_p, seed)
        extra_length = tf.constant(self.metadata["extra_length"] if extra_length is None
                                   else extra_length, tf.int32)
        return translate_in_batches(
            lambda batch: serve(text=batch, temperature=temperature, top_k=top_k,
                                top_p=top_p, seed=seed, extra_length=extra_length),
            sentences, batch_size)

    def explain(self, sentences, beam_size=None, alpha=None, extra_length=None,
                batch_size=32):
        """As `Translator.explain` (defaults: the export's), through the
        `translate_explain` signature."""
        serve = self._signature(TRANSLATE_EXPLAIN)
        options = self._search_options(beam_size, alpha, extra_length)
        return explain_in_batches(lambda batch: serve(text=batch, **options), sentences,
                                  batch_size)

    def _search_options(self, beam_size, alpha, extra_length):
        """The `beam_size`, `alpha` and `extra_length` inputs of a signature
        as tensors, None meaning the export's default."""
        m = self.metadata
        return dict(
            beam_size=tf.constant(m["beam_size"] if beam_size is None else beam_size,
                                  tf.int32),
            alpha=tf.constant(m["alpha"] if alpha is None else alpha, tf.float32),
            extra_length=tf.constant(
                m["extra_length"] if extra_length is None else extra_length, tf.int32))

    def _signature(self, name):
        """The loaded signature `name`; a clear error for an export that
        predates it."""
        if name not in self.loaded.signatures:
            raise ValueError(f"{self.path} has no {name} signature (exported before it "
                             "existed): export it again.")
        return self.loaded.signatures[name]


def load_translator(path):
    """A `SavedModelTranslator` for `<dir>/<version>` or `<dir>` (newest)."""
    return SavedModelTranslator(path)


def open_translator(run_dir=None, checkpoint=None, saved_model=None, ensemble=(),
                    **defaults):
    """The translator a command line asked for: a `SavedModelTranslator` for
    `saved_model`, else a `Translator` for `run_dir` (and `checkpoint`; with
    `ensemble`, more run directories decoding with it as one ensemble, see
    `translator_from_run_directory`).
    `defaults`: `Translator` decoding defaults (ignored for a SavedModel,
    whose defaults were fixed at export; pass options to `translate`), but
    a `min_length` other than the SavedModel's is a `ValueError`: it is
    fixed at export."""
    if (saved_model is None) == (run_dir is None):
        raise ValueError("Give exactly one of a run directory or a SavedModel.")
    if saved_model is not None:
        if checkpoint is not None or ensemble:
            raise ValueError("`checkpoint` and `ensemble` apply to a run directory, not a "
                             "SavedModel.")
        translator = load_translator(saved_model)
        min_length = defaults.get("min_length")
        fixed = translator.metadata.get("min_length", 0)  # exports before it had none
        if min_length is not None and min_length != fixed:
            raise ValueError(f"--min-length is fixed at export: {saved_model} searches with "
                             f"min_length {fixed}; export again with --min-length "
                             f"{min_length}, or translate from the run directory.")
        return translator
    from keras_transformer.export.loading import translator_from_run_directory

    return translator_from_run_directory(
        run_dir, checkpoint, ensemble=ensemble,
        **{k: v for k, v in defaults.items() if v is not None}
    )


def export_saved_model(translator, model_dir, version=None, examples=None):
    """Writes `translator` as the next version of `model_dir`, atomically,
    in the layout TF Serving watches: `<model_dir>/<version>/saved_model.pb`
    (`export_translator` with `model_dir = <output_dir>/<name>`).

    Args:
        translator: a `Translator`.
        model_dir: the model's base path, e.g. "saved_models/mine"; its last
            part is the model's name (letters, digits, `_`, `.`, `-`).
        version: an int; default one more than the largest existing.
        examples: optional source sentences for kt-serve's playground.

    Returns: the path of the new version directory.

    Example:

    ```python
    import os
    import tempfile

    import keras_transformer as kt

    tok = kt.SubwordTokenizer.train([f"a dog {i} runs" for i in range(100)],
                                    vocab_size=400)
    model = kt.Transformer(kt.get_config("tiny", tokenizer=tok))
    model.build()
    base = os.path.join(tempfile.mkdtemp(), "mine")
    path = kt.export_saved_model(kt.Translator(model, tok), base)
    assert path == os.path.join(base, "1")
    translations, scores = kt.load_saved_model(base).translate(["a dog runs"])
    ```
    """
    model_dir = os.path.abspath(os.fspath(model_dir))
    return export_translator(translator, output_dir=os.path.dirname(model_dir),
                             name=os.path.basename(model_dir), version=version,
                             examples=examples)


def load_saved_model(path):
    """An exported translator loaded back (`SavedModelTranslator`): `path`
    is a version directory or a model's base path (its newest version).
    Its `translate`, `translate_nbest`, `sample` and `explain` take Python
    strings and return Python values, with the export's decoding defaults.

    Example:

    ```python
    import os
    import tempfile

    import keras_transformer as kt

    tok = kt.SubwordTokenizer.train([f"a cat {i} sits" for i in range(100)],
                                    vocab_size=400)
    model = kt.Transformer(kt.get_config("tiny", tokenizer=tok))
    model.build()
    base = os.path.join(tempfile.mkdtemp(), "cats")
    kt.export_saved_model(kt.Translator(model, tok), base)
    translator = kt.load_saved_model(base)
    (translation,), (score,) = translator.translate(["a cat sits"])
    assert isinstance(translation, str)
    ```
    """
    return SavedModelTranslator(path)


def translator_from_saved_model(path, **defaults):
    """A `Translator` rebuilt from a SavedModel this package exported
    (`<dir>/<version>`, or `<dir>`: its newest version), for re-exporting
    it in another format when the run directory is gone: the model built
    from the export's config with its saved weights, the SentencePiece
    models read from its graph, and its search defaults and `min_length`
    (`defaults`, `Translator` keywords, replace them). Its serving
    functions give the SavedModel's translations.

    Raises: `ValueError` naming the export when its weights do not match
    the model its config builds (another package version's layout).

    Example:
    >>> translator = translator_from_saved_model(saved_model_dir)  # kt-export
    >>> translator.translate(["a cat sits on the mat"])[0] == \\
    ...     load_translator(saved_model_dir).translate(["a cat sits on the mat"])[0]
    True
    """
    import tensorflow_text  # noqa: F401  (registers the SavedModel's tokenizer ops)

    from keras_transformer.config import TransformerConfig
    from keras_transformer.export.translator import Translator
    from keras_transformer.tokenizer import SubwordTokenizer
    from keras_transformer.transformer import Transformer

    path = resolve_version(path)
    metadata = read_metadata(path)
    model = Transformer(TransformerConfig.from_dict(metadata["config"]).replace(dropout=0.0))
    model.build()
    unique = {}
    for weight in model.weights:
        unique.setdefault(id(getattr(weight, "value", weight)), weight)
    saved = tf.saved_model.load(path).model_variables
    weights = list(unique.values())
    if [tuple(w.shape) for w in weights] != [tuple(v.shape) for v in saved]:
        raise ValueError(f"{path}: its weights do not match the model its config builds "
                         f"({len(saved)} saved against {len(weights)}); re-export it from "
                         "its run directory.")
    for weight, value in zip(weights, saved):
        weight.assign(value.numpy())
    tokenizers = [SubwordTokenizer(proto) for proto in _sentencepiece_models(path)]
    if metadata.get("shared_vocabulary", True):
        source = target = tokenizers[0]
    else:
        source, target = (_of_size(tokenizers, metadata[key], path)
                          for key in ("source_vocab_size", "target_vocab_size"))
    saved_defaults = {"beam_size": metadata["beam_size"], "alpha": metadata["alpha"],
                      "extra_length": metadata["extra_length"],
                      "min_length": metadata.get("min_length", 0)}
    return Translator(model, source, target_tokenizer=target,
                      **{**saved_defaults, **defaults})


def _of_size(tokenizers, size, path):
    """The one of `tokenizers` of vocabulary `size`; `ValueError` when not
    exactly one is (two vocabularies of one size cannot be told apart)."""
    matching = [t for t in tokenizers if t.vocab_size == size]
    if len(matching) != 1:
        raise ValueError(f"{path}: cannot tell its source and target vocabularies apart "
                         f"({len(matching)} of {len(tokenizers)} have {size} pieces); "
                         "re-export it from its run directory.")
    return matching[0]


def _sentencepiece_models(path):
    """The distinct SentencePiece models (serialized) of a SavedModel's
    `SentencepieceOp` nodes."""
    from tensorflow.core.protobuf import saved_model_pb2

    document = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        document.ParseFromString(f.read())
    graph = document.meta_graphs[0].graph_def
    nodes = list(graph.node) + [node for function in graph.library.function
                                for node in function.node_def]
    found = []
    for node in nodes:
        if node.op == "SentencepieceOp" and node.attr["model"].s not in found:
            found.append(node.attr["model"].s)
    if not found:
        raise ValueError(f"{path}: no SentencePiece model in its graph; is it an export of "
                         "this package?")
    return found
