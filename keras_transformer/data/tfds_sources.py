"""TensorFlow Datasets translation corpora, in either direction.
TensorFlow-only module.

`tfds_source("wmt14_translate/de-en", "train", "en", "de")` gives English ->
German pairs of WMT'14 (the paper's en-de task; `wmt14_translate/fr-en` for
en-fr); `wmt_t2t_translate/de-en` is the Tensor2Tensor version of the same
data, `ted_hrlr_translate/pt_to_en` the small TED talks corpus. Any TFDS
dataset whose examples are dicts with one text feature per language works:
the languages pick the features, so one dataset serves both directions.
"""

import tensorflow as tf
import tensorflow_datasets as tfds

# The paper's tasks and the usual small ones; any other TFDS name works too.
KNOWN_DATASETS = (
    "wmt14_translate/de-en",
    "wmt14_translate/fr-en",
    "wmt_t2t_translate/de-en",
    "ted_hrlr_translate/pt_to_en",
)

# Generic split names -> TFDS split names.
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation",
               "dev": "validation", "test": "test"}


def tfds_source(name, split, src_lang, tgt_lang, data_dir=None, download=True,
                shuffle_files=False, read_config=None, **unused):
    """`(source_text, target_text)` pairs of a TFDS translation dataset.

    Args:
        name: `<dataset>/<config>`, e.g. `wmt14_translate/de-en`.
        split: `train`, `validation` (`val`, `dev`), `test`, or any TFDS split
            expression (`train[:1%]`).
        src_lang, tgt_lang: feature names, e.g. `en` and `de`.
        data_dir: TFDS data directory (default `~/tensorflow_datasets`).
        download: download and prepare the data when not present yet.
        shuffle_files: shuffle the order of the prepared shard files.
        read_config: a `tfds.ReadConfig` (e.g. to shard per worker).

    Returns: a `tf.data.Dataset` of `(tf.string [], tf.string [])`.
    """
    builder = tfds.builder(name, data_dir=data_dir)
    features = builder.info.features
    languages = sorted(getattr(features, "languages", None) or features.keys())
    for role, lang in (("source", src_lang), ("target", tgt_lang)):
        if lang not in languages:
            raise ValueError(
                f"TFDS dataset {name!r} has no language {lang!r} for the {role}; "
                f"its languages are {languages}. Pass --src-lang/--tgt-lang among them."
            )
    if src_lang == tgt_lang:
        raise ValueError(f"Source and target language are both {src_lang!r}.")
    if download:
        builder.download_and_prepare()
    dataset = builder.as_dataset(
        split=SPLIT_NAMES.get(split, split), shuffle_files=shuffle_files, read_config=read_config
    )

    def to_pair(example):
        return (tf.convert_to_tensor(example[src_lang], tf.string),
                tf.convert_to_tensor(example[tgt_lang], tf.string))

    return dataset.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)
