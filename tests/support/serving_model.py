"""For tests of `kt-serve`: the tiny exported translator and the server
subprocess of benchmarks/tiny_serving.py, which the serving benchmark
shares.

`export_tiny_model` and `export_tiny_ctranslate2` build each distinct
export (name, seed, examples, ...) once per test run, in the run's cache
directory (conftest.py), and copy it where asked: the same files a fresh
export writes, without tracing and saving the same model again in every
test module."""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil

from benchmarks import tiny_serving
from benchmarks.tiny_serving import (  # noqa: F401  (re-exported for the tests)
    MAX_LENGTH,
    READY,
    export_tiny_versions,
    start_server,
    stop_server,
)

CACHE = "KT_TEST_EXPORT_CACHE"


def export_tiny_model(directory, name="tiny", version=None, examples=None, seed=20261126,
                      num_layers=tiny_serving.NUM_LAYERS):
    """`benchmarks.tiny_serving.export_tiny_model`, from the run's cache."""
    return _cached("saved_model", tiny_serving.export_tiny_model, directory, name, version,
                   dict(examples=examples, seed=seed, num_layers=num_layers))


def export_tiny_ctranslate2(directory, name="tiny", version=1, examples=None, seed=20261126,
                            quantization="float32", num_layers=tiny_serving.NUM_LAYERS):
    """`benchmarks.tiny_serving.export_tiny_ctranslate2`, from the run's cache."""
    return _cached("ctranslate2", tiny_serving.export_tiny_ctranslate2, directory, name, version,
                   dict(examples=examples, seed=seed, quantization=quantization,
                        num_layers=num_layers))


def _cached(kind, export, directory, name, version, options):
    """`export(directory, name=name, version=version, **options)`'s files:
    exported once into the cache (under a lock, as the xdist workers share
    it), then copied to `<directory>/<name>/<version>/` (version None: the
    next after those there). Without a cache (one process, no conftest),
    the export itself."""
    root = os.environ.get(CACHE)
    if not root or not os.path.isdir(root):
        return export(directory, name=name, version=version, **options)
    key = hashlib.sha256(json.dumps([kind, name, options], sort_keys=True).encode())
    cached = os.path.join(root, key.hexdigest()[:16])
    with _locked(cached + ".lock"):
        if not os.path.isdir(cached):
            built = export(cached + ".tmp", name=name, version=1, **options)
            os.rename(os.path.dirname(os.path.dirname(built)), cached)
    model_dir = os.path.join(str(directory), name)
    if version is None:
        taken = [int(v) for v in os.listdir(model_dir) if v.isdigit()] \
            if os.path.isdir(model_dir) else []
        version = max(taken, default=0) + 1
    target = os.path.join(model_dir, str(version))
    shutil.copytree(os.path.join(cached, name, "1"), target)
    return target


@contextlib.contextmanager
def _locked(path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
