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

