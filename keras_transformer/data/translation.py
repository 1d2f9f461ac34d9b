"""The data of a user's script: text pairs from files, lists or datasets
(`read_pairs`, `pairs_dataset`), and `translation_dataset`, the
token-budgeted batches `model.fit` takes (`batching.token_batches`).
TensorFlow-only module."""

import os

import tensorflow as tf

from keras_transformer.data import batching, sources


def pairs_dataset(pairs):
    """A `tf.data.Dataset` of `(source_text, target_text)` strings from:

    - a path (`str` or `os.PathLike`): one `source<TAB>target` pair per line;
    - a `(source_path, target_path)` tuple: two aligned files;
    - a list of `(source, target)` string pairs;
    - a `tf.data.Dataset` of such pairs (returned as it is).

    Files may be plain or gzipped, UTF-8; they are checked first, and a
    missing, empty, undecodable or misaligned file or a bad line is a
    `ValueError` naming the file and the line.

    Example:

    ```python
    import keras_transformer as kt

    pairs = kt.data.pairs_dataset([("a dog", "ein Hund"), ("a cat", "eine Katze")])
    assert [s.decode() for s, _ in pairs.as_numpy_iterator()] == ["a dog", "a cat"]
    ```
    """
    if isinstance(pairs, tf.data.Dataset):
        return pairs
    if isinstance(pairs, (str, os.PathLike)):
        return sources.pairs_from_paths(tsv=pairs)
    if isinstance(pairs, tuple) and len(pairs) == 2 and all(
            isinstance(p, (str, os.PathLike)) for p in pairs):
        return sources.pairs_from_paths(source=pairs[0], target=pairs[1])
    pairs = list(pairs)
    for number, pair in enumerate(pairs, 1):
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or not all(isinstance(side, str) for side in pair)):
            raise ValueError(f"pair {number}: expected (source, target) strings, received "
                             f"{pair!r:.80}.")
    if not pairs:
        raise ValueError("No pairs: the list is empty.")
    return tf.data.Dataset.from_tensor_slices(
        ([s for s, _ in pairs], [t for _, t in pairs]))


def read_pairs(pairs, limit=None):
    """The first `limit` pairs (all when None) of anything `pairs_dataset`
    takes, as a list of `(source, target)` Python strings, e.g. the
    sentences and references of validation BLEU.

    Example:

    ```python
    import keras_transformer as kt

    assert kt.data.read_pairs([("a dog", "ein Hund")]) == [("a dog", "ein Hund")]
    ```
    """
    dataset = pairs_dataset(pairs)
    if limit is not None:
        dataset = dataset.take(limit)
    return [(s.decode("utf-8"), t.decode("utf-8")) for s, t in dataset.as_numpy_iterator()]


def translation_dataset(pairs, tokenizer, batch_tokens=4096, max_length=256,
                        shuffle_buffer=0, seed=None, repeat=False, target_tokenizer=None,
                        skip_batches=0, cache_tokenized=False, length_filter=None,
                        autotune=None):
    """Batches for `model.fit` from text pairs (paper section 5.1).

    The pairs are tokenized in the graph, `source + eos`, `bos + target`,
    `target + eos`; pairs with a side longer than `max_length` tokens are
    dropped (counted by `length_filter`); the rest are bucketed by length so
    that every batch holds at most `batch_tokens` source and `batch_tokens`
    target positions, padding included.

    Args:
        pairs: a TSV path, a `(source_path, target_path)` tuple, a list of
            `(source, target)` strings or a dataset of them (`pairs_dataset`).
        tokenizer: the (shared or source) `SubwordTokenizer`.
        batch_tokens: token budget per batch and side.
        max_length: longest side kept, in tokens (bos/eos included).
        shuffle_buffer: shuffle the pairs with this buffer (0: file order).
        seed: the shuffle seed (the same seed, the same stream of batches).
        repeat: repeat forever, for `fit(..., steps_per_epoch=N)`; a finite
            dataset (False) suits validation data.
        target_tokenizer: the target side's `SubwordTokenizer` (separate
            vocabularies; same pad, bos and eos ids).
        skip_batches: skip this many batches of the stream, to resume it
            (`TrainingRun.skip_batches`).
        cache_tokenized: tokenize once and keep the ids in memory.
        length_filter: a `batching.LengthFilter(max_length)` to read the
            counts of kept and dropped pairs from.
        autotune: tf.data autotuning; None: on with `repeat`, off without.
            False spares a run of minutes the wait of up to a minute that
            deleting an autotuned iterator can cost when `fit` returns
            (kt-train's `--input-autotune off`; docs/performance.md).

    Returns: a `tf.data.Dataset` of `((source_ids, target_input_ids),
    target_ids)`, int32 `(batch, length)`, padded with `tokenizer.pad_id`.

    Example:

    ```python
    import keras_transformer as kt

    lines = [f"the dog {i} sees a cat" for i in range(200)]
    tok = kt.SubwordTokenizer.train(lines, vocab_size=400)
    batches = kt.data.translation_dataset([(s, s.upper()) for s in lines], tok,
                                          batch_tokens=256, max_length=32)
    (source_ids, target_input_ids), target_ids = next(iter(batches))
    assert source_ids.shape[0] * source_ids.shape[1] <= 256
    ```
    """
    return batching.token_batches(
        pairs_dataset(pairs), tokenizer, batch_tokens, max_length, length_filter,
        shuffle_buffer=shuffle_buffer, seed=seed, repeat=repeat,
        cache_tokenized=cache_tokenized, target_tokenizer=target_tokenizer,
        skip_batches=skip_batches, autotune=autotune)
