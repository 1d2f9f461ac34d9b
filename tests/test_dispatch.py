"""keras_transformer/dispatch.py, the one door to the TensorFlow-only fast
paths, and keras_transformer/kernels/platform.py, which tells it what
TensorFlow multiplies with here."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import dispatch
from keras_transformer.kernels import platform
from support.common import force_matmul_kernels, train_on_one_batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _in_fresh_process(code, **env):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "", **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=ROOT)
    return out


@pytest.mark.parametrize("setting,expected", [("0", "False"), ("1", "True")])
def test_reads_tensorflows_onednn_setting(setting, expected):
    # The private query must follow TF_ENABLE_ONEDNN_OPTS; if a TensorFlow
    # release moves or changes it, this fails instead of silently choosing.
    out = _in_fresh_process(
        "from keras_transformer import dispatch; from keras_transformer.kernels import platform; "
        "print(platform.tensorflow_uses_onednn(), dispatch.multiplies_with_eigen())",
        TF_ENABLE_ONEDNN_OPTS=setting)
    assert out.returncode == 0, out.stderr
    onednn, eigen = out.stdout.strip().splitlines()[-1].split()
    assert onednn == expected
    assert eigen == str(expected == "False")  # no GPU visible


def test_the_environment_switches():
    code = ("from keras_transformer import dispatch; s = dispatch._settings; "
            "print(s['fast_paths'], sorted(s['disabled']), s['matmul_kernels'], "
            "dispatch.multiplies_with_eigen(), dispatch.enabled('fused_adam'))")
    out = _in_fresh_process(code, KT_FAST_PATHS="off", KT_MATMUL_KERNELS="eigen",
                            KT_DISABLE_FAST_PATHS="eigen_slices, fused_adam")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "off ['eigen_slices', 'fused_adam'] eigen True False"
    # A misspelt path or value is an error naming the variable, at import.
    out = _in_fresh_process("import keras_transformer", KT_DISABLE_FAST_PATHS="fused_adma")
    assert out.returncode != 0
    assert "KT_DISABLE_FAST_PATHS" in out.stderr and "fused_adma" in out.stderr
    for settings, name in [(("on", (), "auto"), "KT_FAST_PATHS"),
                           (("auto", (), "mkl"), "KT_MATMUL_KERNELS")]:
        with pytest.raises(ValueError, match=name):
            dispatch._validated(*settings)


def test_configure_validates_and_restores():
    with pytest.raises(ValueError, match="Unknown fast path"):
        dispatch.configure(disabled={"no_such_path"})
    with pytest.raises(ValueError, match="matmul_kernels"):
        dispatch.configure(matmul_kernels="cuda")
    before = dict(dispatch._settings)
    with dispatch.configured(fast_paths="off", matmul_kernels="eigen"):
        assert not dispatch.enabled("fused_adam")
        assert dispatch._settings["matmul_kernels"] == "eigen"
    assert dispatch._settings == before
    with pytest.raises(ValueError, match="Unknown fast path"):
        dispatch.enabled("fused_adma")


def test_eigen_only_without_onednn_and_without_a_gpu(monkeypatch):
    monkeypatch.setattr(platform, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(platform, "has_gpu", lambda: False)
    assert dispatch.multiplies_with_eigen()
    monkeypatch.setattr(platform, "tensorflow_uses_onednn", lambda: True)
    assert not dispatch.multiplies_with_eigen()  # oneDNN multiplies
    monkeypatch.undo()
    monkeypatch.setattr(platform, "tensorflow_uses_onednn", lambda: False)
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: ["/device:GPU:0"] if kind == "GPU" else [])
    assert platform.has_gpu()
    assert not dispatch.multiplies_with_eigen()  # a GPU multiplies
    # The switch overrides what TensorFlow says, either way.
    force_matmul_kernels(monkeypatch, "eigen")
    assert dispatch.multiplies_with_eigen()
    force_matmul_kernels(monkeypatch, "onednn")
    monkeypatch.setattr(platform, "tensorflow_uses_onednn", lambda: False)
    assert not dispatch.multiplies_with_eigen()


def test_not_eigen_inside_a_function_xla_compiles(monkeypatch):
    # XLA emits the products of a jit-compiled function itself: neither the
    # slices nor attention compiled on its own belong there (the latter
    # nested in an XLA-compiled training step is far slower).
    force_matmul_kernels(monkeypatch, "eigen")
    seen = {}

    def probe(where):
        seen[where] = (platform.inside_xla_compilation(), dispatch.multiplies_with_eigen())
        return tf.constant(0.0)

    probe("eager")
    tf.function(lambda: probe("graph"))()
    tf.function(lambda: probe("xla"), jit_compile=True)()
    called = tf.function(lambda: probe("called from xla"))
    tf.function(lambda: called(), jit_compile=True)()
    assert seen == {"eager": (False, True), "graph": (False, True),
                    "xla": (True, False), "called from xla": (True, False)}


def _spy_on_kernels(monkeypatch):
    """Records the name of each TensorFlow kernel entry point a trace calls."""
    from keras_transformer.kernels import adam, attention, cross_entropy, dense, dropout
    from keras_transformer.kernels import vocabulary_projection

    calls = []
    for module, name in ((dense, "dense"), (vocabulary_projection, "logits"),
                         (attention, "attention"), (cross_entropy, "label_smoothed_cross_entropy"),
                         (dropout, "dropout"), (dropout, "dropout_add_norm")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    original_update = adam.FusedAdam.update_step
    monkeypatch.setattr(adam.FusedAdam, "update_step",
                        lambda *a, **k: calls.append("fused_adam") or original_update(*a, **k))
    return calls


def test_model_compiled_by_xla_takes_no_eigen_path(monkeypatch):
    """`model.compile(jit_compile=True)` on an Eigen host trains without
    vocabulary slices and without separately compiled attention."""
    from keras_transformer.kernels import attention, eigen_slices

    calls = []
    for module, name in ((eigen_slices, "matmul"), (attention, "attention")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    force_matmul_kernels(monkeypatch, "eigen")
    assert dispatch.multiplies_with_eigen()  # outside XLA both would be taken
    config = kt.get_config("tiny", vocab_size=2048, dropout=0.0)  # a vocabulary Eigen slices
    losses, _ = train_on_one_batch(config, steps=2, jit_compile=True)
    assert calls == []
    assert np.all(np.isfinite(losses))


def _train_step_kernels(monkeypatch, config):
    calls = _spy_on_kernels(monkeypatch)
    train_on_one_batch(config, steps=1)
    return set(calls)


def test_every_path_is_taken_where_it_applies_and_none_when_off(monkeypatch):
    # d_ff and the vocabulary a multiple of 2,048, dropout on: under Eigen
    # every path applies (attention compiles only without attention
    # dropout, which the tiny preset has none of). One layer: each layer
    # takes the same paths, and the four steps trace a smaller graph.
    config = kt.get_config("tiny", vocab_size=2048, d_ff=2048, dropout=0.1, num_layers=1)
    force_matmul_kernels(monkeypatch, "eigen")
    assert _train_step_kernels(monkeypatch, config) == {
        "dense", "logits", "attention", "label_smoothed_cross_entropy", "dropout",
        "dropout_add_norm", "fused_adam"}
    monkeypatch.undo()
    force_matmul_kernels(monkeypatch, "onednn")
    assert _train_step_kernels(monkeypatch, config) == {
        "label_smoothed_cross_entropy", "dropout", "dropout_add_norm", "fused_adam"}
    monkeypatch.undo()
    force_matmul_kernels(monkeypatch, "eigen")
    with dispatch.configured(fast_paths="off"):
        assert _train_step_kernels(monkeypatch, config) == set()
        assert type(kt.transformer_adam(8)) is keras.optimizers.Adam
    monkeypatch.undo()
    force_matmul_kernels(monkeypatch, "eigen")
    with dispatch.configured(disabled={"philox_dropout", "fused_adam", "compiled_attention"}):
        assert _train_step_kernels(monkeypatch, config) == {
            "dense", "logits", "label_smoothed_cross_entropy"}


def test_layers_import_no_kernel():
    """Layers, the model, the loss and the schedule reach kernels only
    through dispatch (tests/test_imports.py checks the import graph; this
    checks the running process): with every fast path off, building and
    training a model imports none of keras_transformer.kernels."""
    code = ("import sys, numpy as np, keras_transformer as kt\n"
            "c = kt.get_config('tiny', vocab_size=40)\n"
            "m = kt.Transformer(c)\n"
            "m.compile(optimizer=kt.transformer_adam(c.d_model), "
            "loss=kt.LabelSmoothedCrossEntropy(0.1))\n"
            "x = np.ones((2, 5), 'int32') * 5\n"
            "m.train_on_batch((x, x), x)\n"
            "print(sorted(n for n in sys.modules if n.startswith('keras_transformer.kernels')))")
    out = _in_fresh_process(code, KT_FAST_PATHS="off")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
