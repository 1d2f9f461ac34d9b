"""Data pipelines (TensorFlow-only): parallel text files, TensorFlow Datasets,
the source registry (`sources`), and token-budgeted batching (`batching`).

Import the submodules directly (`from keras_transformer.data import batching`);
this package imports nothing itself so the pure-Python modules stay light.
"""
