"""`Corpus`: a training run's text pairs by split, from files given by path
or a named source (`text:DIR`, `tfds:NAME/CONFIG`, `builtin`)."""

from keras_transformer.data import sources
from keras_transformer.pipeline.settings import split_files


class Corpus:
    """The run's data: `pairs(split)` for "train", "valid", "test" gives a
    fresh `(source_text, target_text)` dataset; `has(split)`; `describe(split)`.

    Files given by path are checked once here (missing, empty, undecodable,
    misaligned or malformed lines are errors naming the file and the line)
    and counted; afterwards they are read without checking again.

    Args:
        config: a `TrainingConfig` (its data settings: `data`, `src_lang`,
            `tgt_lang`, the `*_split` names and the `*_src`/`*_tgt`/`*_tsv`
            paths).

    Example:

    ```python
    import keras_transformer as kt
    from keras_transformer.pipeline.corpus import Corpus

    corpus = Corpus(kt.TrainingConfig(data="builtin:train=100,val=10,test=10", src_lang="en",
                                      tgt_lang="synth"))
    assert corpus.has("train") and corpus.has("valid") and not corpus.has("test")
    source, target = next(iter(corpus.pairs("train")))
    ```
    """

    def __init__(self, config):
        self.config = config
        self.files, self.splits, self.counts = {}, {}, {}
        for split, named in (("train", config.train_split), ("valid", config.valid_split),
                             ("test", config.test_split)):
            files = split_files(config, split)
            if files is not None:
                self.files[split] = files
                self.counts[split] = sources.count_pairs(**files)
            elif config.data and named:
                self.splits[split] = named

    def has(self, split):
        return split in self.files or split in self.splits

    def pairs(self, split):
        if split in self.files:
            return sources.pairs_from_paths(**self.files[split], validate=False)
        if split in self.splits:
            config = self.config
            return sources.load_pairs(config.data, self.splits[split], config.src_lang,
                                      config.tgt_lang)
        raise ValueError(f"No {split} data was given.")

    def describe(self, split):
        if split in self.files:
            names = " + ".join(v for v in self.files[split].values() if v)
            return f"{self.counts[split]} pairs from {names}"
        return f"split {self.splits[split]!r} of {self.config.data}"
