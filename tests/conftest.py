import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import pytest

import keras_transformer as kt
from keras_transformer import startup
from support.seeding import reseed

# The tests trace and export many models in each worker: the collector at
# the kt-* commands' thresholds (startup.collect_less).
startup.collect_less()

# Helpers the test modules import live in tests/support/ (`from support.common
# import random_ids`): pytest puts this directory on sys.path for this conftest.


EXPORT_CACHE = "KT_TEST_EXPORT_CACHE"


def pytest_configure(config):
    # One directory per test run where the tiny exports are written once
    # and copied from (support/serving_model.py); the xdist workers, started
    # after this, inherit it.
    if not hasattr(config, "workerinput") and EXPORT_CACHE not in os.environ:
        os.environ[EXPORT_CACHE] = tempfile.mkdtemp(prefix="kt-test-exports-")
        config.kt_export_cache = os.environ[EXPORT_CACHE]
        # XLA's programs too: the processes the tests start (kt-translate,
        # a fresh process loading an export) compile the same searches of
        # the same tiny exports again and again.
        os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, [
            os.environ.get("TF_XLA_FLAGS"), "--tf_xla_persistent_cache_directory="
            + os.path.join(os.environ[EXPORT_CACHE], "xla")]))


def pytest_unconfigure(config):
    cache = getattr(config, "kt_export_cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        os.environ.pop(EXPORT_CACHE, None)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    reseed()
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def tiny_config():
    return kt.get_config("tiny", vocab_size=40, dropout=0.0)
