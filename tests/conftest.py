import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import pytest

import keras_transformer as kt

# Helpers the test modules import live in tests/support/ (`from support.common
# import random_ids`): pytest puts this directory on sys.path for this conftest.


@pytest.fixture(autouse=True)
def _seed_and_policy():
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def tiny_config():
    return kt.get_config("tiny", vocab_size=40, dropout=0.0)
