import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest

import keras_transformer as kt

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def tiny_config():
    return kt.get_config("tiny", vocab_size=40, dropout=0.0)


def random_ids(shape, low=4, high=40, seed=0):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype("int32")
