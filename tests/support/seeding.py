"""The tests' seeding, as each test starts (conftest.py)."""

import random
from unittest import mock

import keras
import tensorflow as tf
from tensorflow.python.eager import context

SEED = 1234
_UNDRAWN = random.Random(SEED).getstate()


def reseed():
    """`keras.utils.set_random_seed(SEED)`: Python's, NumPy's, Keras's and
    TensorFlow's seeds, as each test starts.

    `tf.random.set_seed` also clears every kernel and instantiated function
    TensorFlow has cached, only so that stateful random kernels start their
    streams again; a module's models and SavedModels would then be
    instantiated (Grappler, kernels) anew in every test. A random op given
    no seed of its own draws one from the eager context's stream (the tests
    give none), so when nothing has drawn since the last reset, TensorFlow's
    part is skipped: its seeds are already what it would set, and its caches
    are kept."""
    eager = context.context()
    if eager._seed == SEED and eager._rng is not None and eager._rng.getstate() == _UNDRAWN:
        with mock.patch.object(tf.random, "set_seed", lambda seed: None):
            keras.utils.set_random_seed(SEED)
    else:
        keras.utils.set_random_seed(SEED)
