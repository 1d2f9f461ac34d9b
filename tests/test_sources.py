"""keras_transformer/data/sources.py: reading pairs for the vocabulary."""

import pytest
import tensorflow as tf

from keras_transformer.data.sources import sentences_for_vocabulary
from support.timing import best_cpu_seconds


def pairs_dataset(n):
    sources = [f"Größe {i} ist relativ." for i in range(n)]
    targets = [f"Size {i} is relative. ✓" for i in range(n)]
    return tf.data.Dataset.from_tensor_slices((sources, targets)), sources, targets


def one_by_one(dataset, max_pairs=None):
    """What the reader returns, read one element at a time."""
    out = []
    for i, (source, target) in enumerate(dataset.as_numpy_iterator()):
        if max_pairs and i == max_pairs:
            break
        out += [source.decode("utf-8"), target.decode("utf-8")]
    return out


@pytest.mark.parametrize("max_pairs", [None, 0, 1, 7, 16, 23, 100])
def test_both_sides_of_the_first_pairs_in_order(max_pairs):
    # Batches of 7 over 23 pairs: full batches, a short last one, a limit
    # inside a batch, at its end and beyond the data.
    dataset, sources, targets = pairs_dataset(23)
    got = list(sentences_for_vocabulary(dataset, max_pairs, batch_size=7))
    assert got == one_by_one(dataset, max_pairs)
    count = 23 if not max_pairs else min(max_pairs, 23)
    assert got[0::2] == sources[:count] and got[1::2] == targets[:count]


def test_reads_in_batches_not_one_element_at_a_time():
    # Each element tf.data hands to Python has a fixed cost, which batches
    # pay once per batch (docs/performance.md has the figures).
    # The reference (one element at a time) runs in the same process
    # (support/timing.py).
    dataset, _, _ = pairs_dataset(4000)
    seconds, got = best_cpu_seconds({
        "reference": lambda: one_by_one(dataset),
        "ours": lambda: list(sentences_for_vocabulary(dataset))})
    assert got["ours"] == got["reference"]
    assert seconds["ours"] * 5 < seconds["reference"], seconds


@pytest.mark.parametrize("max_pairs", [None, 5, 9])
def test_one_side_for_separate_vocabularies(max_pairs):
    dataset, sources, targets = pairs_dataset(23)
    count = 23 if not max_pairs else max_pairs
    assert list(sentences_for_vocabulary(dataset, max_pairs, batch_size=4,
                                         side="source")) == sources[:count]
    assert list(sentences_for_vocabulary(dataset, max_pairs, batch_size=4,
                                         side="target")) == targets[:count]
    # "both" is the default and interleaves as before.
    assert list(sentences_for_vocabulary(dataset, max_pairs, batch_size=4, side="both")) == \
        list(sentences_for_vocabulary(dataset, max_pairs, batch_size=4)) == \
        one_by_one(dataset, max_pairs)


def test_an_unknown_side_is_refused_at_the_call():
    dataset, _, _ = pairs_dataset(3)
    with pytest.raises(ValueError, match=r"`side` must be one of \('both', 'source', 'target'\), "
                                         r"received 'src'"):
        sentences_for_vocabulary(dataset, side="src")
