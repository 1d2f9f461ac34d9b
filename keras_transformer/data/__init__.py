"""Data pipelines (TensorFlow-only): parallel text files, TensorFlow Datasets,
the source registry (`sources`), token-budgeted batching (`batching`), and
the script-level entry points `translation_dataset`, `pairs_dataset` and
`read_pairs` (`translation`).

The entry points are loaded on first use, so that importing a pure-Python
module of this package (`synthetic`) does not load TensorFlow.
"""

_ENTRY_POINTS = ("translation_dataset", "pairs_dataset", "read_pairs")


def __getattr__(name):
    if name in _ENTRY_POINTS:
        from keras_transformer.data import translation

        return getattr(translation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_ENTRY_POINTS))
