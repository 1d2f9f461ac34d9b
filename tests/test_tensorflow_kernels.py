"""keras_transformer/tensorflow_kernels.py: whether TensorFlow multiplies
with oneDNN, Eigen or a GPU here."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import tensorflow_kernels
from conftest import train_on_one_batch


@pytest.mark.parametrize("setting,expected", [("0", "False"), ("1", "True")])
def test_reads_tensorflows_onednn_setting(setting, expected):
    # The private query must follow TF_ENABLE_ONEDNN_OPTS; if a TensorFlow
    # release moves or changes it, this fails instead of silently choosing.
    code = ("from keras_transformer import tensorflow_kernels as k; "
            "print(k.tensorflow_uses_onednn(), k.multiplies_with_eigen())")
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "3",
           "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    onednn, eigen = out.stdout.strip().splitlines()[-1].split()
    assert onednn == expected
    assert eigen == str(expected == "False")  # no GPU visible


def test_eigen_only_without_onednn_and_without_a_gpu(monkeypatch):
    monkeypatch.setattr(tensorflow_kernels, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    assert tensorflow_kernels.multiplies_with_eigen()
    monkeypatch.setattr(tensorflow_kernels, "tensorflow_uses_onednn", lambda: True)
    assert not tensorflow_kernels.multiplies_with_eigen()  # oneDNN multiplies
    monkeypatch.setattr(tensorflow_kernels, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: ["/device:GPU:0"] if kind == "GPU" else [])
    assert not tensorflow_kernels.multiplies_with_eigen()  # a GPU multiplies


def test_not_eigen_inside_a_function_xla_compiles(monkeypatch):
    # XLA emits the products of a jit-compiled function itself: neither the
    # slices nor attention compiled on its own belong there (the latter
    # nested in an XLA-compiled training step made it ~60x slower).
    monkeypatch.setattr(tensorflow_kernels, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    seen = {}

    def probe(where):
        seen[where] = (tensorflow_kernels.inside_xla_compilation(),
                       tensorflow_kernels.multiplies_with_eigen())
        return tf.constant(0.0)

    probe("eager")
    tf.function(lambda: probe("graph"))()
    tf.function(lambda: probe("xla"), jit_compile=True)()
    called = tf.function(lambda: probe("called from xla"))
    tf.function(lambda: called(), jit_compile=True)()
    assert seen == {"eager": (False, True), "graph": (False, True),
                    "xla": (True, False), "called from xla": (True, False)}


def test_model_compiled_by_xla_takes_no_eigen_path(monkeypatch):
    """`model.compile(jit_compile=True)` on an Eigen host trains without
    vocabulary slices and without separately compiled attention."""
    import numpy as np

    import keras_transformer as kt
    from keras_transformer import compiled_attention, eigen_slices

    calls = []
    for module, name in ((eigen_slices, "matmul"), (compiled_attention, "attention")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    monkeypatch.setattr(tensorflow_kernels, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    assert tensorflow_kernels.multiplies_with_eigen()  # outside XLA both would be taken
    config = kt.get_config("tiny", vocab_size=2048, dropout=0.0)  # a vocabulary Eigen slices
    losses, _ = train_on_one_batch(config, steps=2, jit_compile=True)
    assert calls == []
    assert np.all(np.isfinite(losses))
