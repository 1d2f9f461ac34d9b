"""Data-source registry: `--data <kind>:<location>` -> a dataset of
`(source_text, target_text)` string pairs. TensorFlow-only module.

    text:/data/multi30k            directory of <split>.<lang>[.gz] files
    tfds:wmt14_translate/de-en     TensorFlow Datasets, by name/config
    builtin[:seed=0,train=40000]   the generated corpus, en <-> synth (offline)

A loader is `loader(location, split, src_lang, tgt_lang, **options) ->
tf.data.Dataset of (tf.string [], tf.string [])`; add one with
`register_source("kind", loader)` or by adding it to `SOURCES`.
"""

from keras_transformer.data.synthetic import builtin_source
from keras_transformer.data.text_files import text_directory_source
from keras_transformer.data.tfds_sources import tfds_source

SOURCES = {
    "builtin": builtin_source,
    "text": text_directory_source,
    "tfds": tfds_source,
}


def register_source(kind, loader):
    """Makes `--data <kind>:<location>` call `loader`."""
    if not callable(loader):
        raise TypeError(f"The loader for {kind!r} must be callable, received {loader!r}.")
    SOURCES[kind] = loader


def parse_spec(spec):
    """`"kind:location"` -> `(kind, location)`; `"kind"` -> `(kind, "")`."""
    kind, _, location = spec.partition(":")
    if kind not in SOURCES:
        raise ValueError(
            f"Unknown data source {kind!r} in {spec!r}; expected `<kind>:<location>` with "
            f"kind one of {sorted(SOURCES)} (e.g. `text:/data/multi30k`, "
            "`tfds:wmt14_translate/de-en`)."
        )
    return kind, location


def load_pairs(spec, split, src_lang, tgt_lang, **options):
    """The `(source_text, target_text)` dataset of `split` from source `spec`."""
    kind, location = parse_spec(spec)
    return SOURCES[kind](location, split, src_lang, tgt_lang, **options)


# Pairs per tf.data element read by `sentences_for_vocabulary`.
VOCABULARY_READ_BATCH = 4096


def sentences_for_vocabulary(pairs, max_pairs=None, batch_size=VOCABULARY_READ_BATCH):
    """Python strings of both sides of the first `max_pairs` pairs (source,
    then target, pair by pair), for training the shared subword vocabulary.

    Read in batches of `batch_size` pairs: each element tf.data hands to
    Python has a fixed cost, which one pair at a time would pay a million
    times for the default `--vocab-sentences` (docs/performance.md). Same sentences in the same order, so
    the same vocabulary.
    """
    if max_pairs:
        pairs = pairs.take(max_pairs)
    for sources, targets in pairs.batch(batch_size).as_numpy_iterator():
        for source, target in zip(sources, targets):
            yield source.decode("utf-8")
            yield target.decode("utf-8")
