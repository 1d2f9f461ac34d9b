"""Data-source registry: `--data <kind>:<location>` -> a dataset of
`(source_text, target_text)` string pairs. TensorFlow-only module.

    text:/data/multi30k            directory of <split>.<lang>[.gz] files
    tfds:wmt14_translate/de-en     TensorFlow Datasets, by name/config
    builtin[:seed=0,train=40000]   the generated corpus, en <-> synth (offline)

A loader is `loader(location, split, src_lang, tgt_lang, **options) ->
tf.data.Dataset of (tf.string [], tf.string [])`; add one with
`register_source("kind", loader)` or by adding it to `SOURCES`.

Files given by path, without a split or language naming scheme:
`pairs_from_paths(source=..., target=...)` (two aligned files) or
`pairs_from_paths(tsv=...)` (one `source<TAB>target` file, `data/tsv.py`).
"""

import os

from keras_transformer.data import text_files
from keras_transformer.data import tsv as _tsv
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


def _path_form(source, target, tsv_path):
    """`("parallel", (source, target))` or `("tsv", path)`; ValueError unless
    exactly one of the two forms is given."""
    if tsv_path is not None and source is None and target is None:
        return "tsv", os.fspath(tsv_path)
    if tsv_path is None and source is not None and target is not None:
        return "parallel", (os.fspath(source), os.fspath(target))
    given = [name for name, value in (("source", source), ("target", target),
                                      ("tsv", tsv_path)) if value is not None]
    raise ValueError(
        "Give either `source` and `target` (two aligned files) or `tsv` (one "
        f"source<TAB>target file), not {' and '.join(given) or 'nothing'}."
    )


def count_pairs(source=None, target=None, tsv=None):
    """Checks the files as `pairs_from_paths(..., validate=True)` does and
    returns the number of pairs they hold (`int`, at least 1).

    Raises `text_files.TextFileError` (a `ValueError`) naming the file, and
    the line where one is at fault; `ValueError` for a wrong set of arguments.
    """
    form, paths = _path_form(source, target, tsv)
    if form == "tsv":
        return _tsv.count_pairs(paths)
    return text_files.validate_parallel_files(*paths)


def pairs_from_paths(source=None, target=None, tsv=None, validate=True):
    """`(source_text, target_text)` pairs from files given by path.

    Args:
        source, target: two aligned files, one sentence per line, any names.
        tsv: or one file, one `source<TAB>target` pair per line.
        validate: check the files first (`count_pairs`); pass False when
            `count_pairs` already did.

    Files may be plain or gzipped (detected from the content), UTF-8, with
    `\n` or `\r\n` line ends.

    Returns: a `tf.data.Dataset` of `(tf.string [], tf.string [])`, in file
    order.

    Raises: `ValueError` unless exactly one form is given;
    `text_files.TextFileError` (a `ValueError`) naming the file and line for
    a missing, empty, undecodable or misaligned file or a bad TSV line.
    """
    form, paths = _path_form(source, target, tsv)
    if form == "tsv":
        return _tsv.tsv_dataset(paths, validate=validate)
    return text_files.parallel_text_dataset(*paths, validate=validate)


# Pairs per tf.data element read by `sentences_for_vocabulary`.
VOCABULARY_READ_BATCH = 4096

VOCABULARY_SIDES = ("both", "source", "target")


def sentences_for_vocabulary(pairs, max_pairs=None, batch_size=VOCABULARY_READ_BATCH,
                             side="both"):
    """Python strings of the first `max_pairs` pairs, for training a subword
    vocabulary.

    `side="both"`: source, then target, pair by pair (one shared
    vocabulary); `"source"` or `"target"`: that side only, in order (separate
    vocabularies).

    Read in batches of `batch_size` pairs: each element tf.data hands to
    Python has a fixed cost, which one pair at a time would pay a million
    times for the default `--vocab-sentences` (docs/performance.md). Same
    sentences in the same order, so the same vocabulary.
    """
    if side not in VOCABULARY_SIDES:
        raise ValueError(f"`side` must be one of {VOCABULARY_SIDES}, received {side!r}.")
    return _sentences(pairs, max_pairs, batch_size, side)


def _sentences(pairs, max_pairs, batch_size, side):
    # A separate generator, so a bad `side` raises at the call.
    if max_pairs:
        pairs = pairs.take(max_pairs)
    for sources, targets in pairs.batch(batch_size).as_numpy_iterator():
        if side == "both":
            for source, target in zip(sources, targets):
                yield source.decode("utf-8")
                yield target.decode("utf-8")
        else:
            for sentence in sources if side == "source" else targets:
                yield sentence.decode("utf-8")
