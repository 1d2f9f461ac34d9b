"""keras_transformer/tensorflow_kernels.py: whether TensorFlow multiplies
with oneDNN, Eigen or a GPU here."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer import tensorflow_kernels


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
