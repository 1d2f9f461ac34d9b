import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers.dense import Dense


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8), (2, 3, 4, 8)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_equals_keras_dense_values_gradients_and_weights(shape, activation):
    ours = Dense(6, activation=activation)
    theirs = keras.layers.Dense(6, activation=activation)
    x = tf.constant(np.random.default_rng(0).normal(size=shape).astype("float32"))
    ours.build(shape)
    theirs.build(shape)
    theirs.set_weights(ours.get_weights())
    assert [w.name for w in ours.weights] == [w.name for w in theirs.weights]
    outputs = []
    for layer in (ours, theirs):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            loss = tf.reduce_sum(y * tf.range(6.0))
        outputs.append([y.numpy()] + [g.numpy() for g in tape.gradient(
            loss, [x] + [w.value for w in layer.weights])])
    for a, b in zip(*outputs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert outputs[0][0].shape == shape[:-1] + (6,)


def test_unknown_leading_dimensions_in_a_graph():
    layer = Dense(4)
    layer.build((None, None, 3))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3], tf.float32)])
    def run(x):
        return layer(x)

    assert run(tf.ones((2, 5, 3))).shape == (2, 5, 4)
    assert Dense.from_config(layer.get_config()).units == 4


@pytest.mark.parametrize("units,d_in,activation", [(16, 8, "relu"), (8, 8, None), (4, 8, None)])
def test_training_outside_eigen_is_keras_dense(monkeypatch, units, d_in, activation):
    """Where no product is sliced (oneDNN, or widths not a multiple of
    2,048), training takes Keras's own `Dense.call` and gradient: values and
    gradients equal `keras.layers.Dense`'s bit for bit, and no kernel of
    `keras_transformer/kernels/dense.py` is built."""
    from keras_transformer.kernels import dense as written_out
    from support.common import force_matmul_kernels

    calls = []
    monkeypatch.setattr(written_out, "dense", lambda *a, **k: calls.append(1))
    x = tf.constant(np.random.default_rng(1).normal(size=(2, 5, d_in)).astype("float32"))
    for kernels in ("onednn", "eigen"):
        force_matmul_kernels(monkeypatch, kernels)
        ours = Dense(units, activation=activation)
        theirs = keras.layers.Dense(units, activation=activation)
        ours.build(x.shape)
        theirs.build(x.shape)
        theirs.set_weights(ours.get_weights())
        outputs = []
        for layer in (ours, theirs):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(y * tf.sin(y))
            outputs.append([y.numpy()] + [g.numpy() for g in tape.gradient(
                loss, [x] + [w.value for w in layer.weights])])
        for a, b in zip(*outputs):
            np.testing.assert_array_equal(a, b)
    assert calls == []
