"""A `Translator` for a run directory's model: the checkpoint a selector
names, its tokenizers, and the members of an ensemble. TensorFlow-only
module."""

from keras_transformer.decoding.ensemble import TransformerEnsemble
from keras_transformer.export.translator import Translator


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
    from keras_transformer.training.checkpoints import averaged_if_asked

    runs = [r if isinstance(r, RunDirectory) else RunDirectory(r)
            for r in [run_dir, *ensemble]]
    source, target = runs[0].load_tokenizers()  # the same object twice when shared
    for run in runs[1:]:
        _check_same_vocabulary(runs[0], run, (source, target))
    models = [run.load_model(checkpoint=averaged_if_asked(run, checkpoint),
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
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SavedModel's tokenizer ops)

    from keras_transformer.config import TransformerConfig
    from keras_transformer.export.saved_model import read_metadata, resolve_version
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
    import os

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
