"""The tests' seeding (`support.seeding.reseed`, before every test): every test
starts from the same random streams, and TensorFlow's caches survive it when
nothing drew from them."""

import numpy as np
import tensorflow as tf

import keras_transformer as kt
from support.seeding import reseed

SENTENCES = [f"a dog {i} runs after the cat" for i in range(60)]


def test_each_reseed_restarts_every_stream():
    def draws():
        reseed()
        return (np.random.rand(3), tf.random.normal([3]).numpy(),
                tf.random.normal([3]).numpy())

    first, second = draws(), draws()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[1], first[2])  # one stream, not one value


def test_an_eager_resource_outlives_a_reseed_that_follows_no_draw():
    tokenizer = kt.SubwordTokenizer.train(SENTENCES, vocab_size=400)
    before = tokenizer.tokenize(["a dog runs"]).numpy().tolist()
    reseed()
    reseed()
    assert tokenizer.tokenize(["a dog runs"]).numpy().tolist() == before
