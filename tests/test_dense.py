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


def _spy_on_written_out_gradient(monkeypatch):
    from keras_transformer.kernels import dense as dense_gradient

    calls = []
    original = dense_gradient.dense

    def spy(*args, **kwargs):
        calls.append(args[1].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(dense_gradient, "dense", spy)
    return calls


@pytest.mark.parametrize("units,d_in,activation,use_bias", [
    (16, 8, "relu", True),   # the feed-forward network's inner layer
    (8, 8, None, True),      # an attention projection
    (12, 8, None, False),
])
def test_training_gradient_written_out_equals_keras_dense(monkeypatch, units, d_in, activation,
                                                          use_bias):
    """In float32 training on TensorFlow, layers at least as wide as their
    input take `kernels/dense.py`; values and gradients stay Keras's."""
    calls = _spy_on_written_out_gradient(monkeypatch)
    ours = Dense(units, activation=activation, use_bias=use_bias)
    theirs = keras.layers.Dense(units, activation=activation, use_bias=use_bias)
    x = tf.constant(np.random.default_rng(1).normal(size=(2, 5, d_in)).astype("float32"))
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
    assert calls == [(d_in, units)]
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])  # the same forward ops
    for a, b in zip(outputs[0][1:], outputs[1][1:]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_written_out_gradient_only_where_it_pays(monkeypatch):
    """Not at inference, not for a kernel narrower than its input, not in
    bfloat16, not for other activations."""
    calls = _spy_on_written_out_gradient(monkeypatch)
    x = tf.ones((3, 8))
    Dense(8)(x)                                   # inference
    Dense(8)(x, training=False)
    Dense(4)(x, training=True)                    # narrower than its input
    Dense(8, activation="gelu")(x, training=True)
    Dense(8, dtype="mixed_bfloat16")(x, training=True)
    assert calls == []
    Dense(8)(x, training=True)
    assert calls == [(8, 8)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transposed_copy_is_exact(dtype):
    from keras_transformer.kernels.dense import transposed

    kernel = tf.cast(tf.random.normal((5, 7)), dtype)
    np.testing.assert_array_equal(transposed(kernel).numpy(), tf.transpose(kernel).numpy())


def test_model_training_takes_the_written_out_gradient(monkeypatch, tiny_config):
    """`fit`'s training flag reaches the Dense layers inside the model: the
    attention projections and the feed-forward inner layers."""
    import keras_transformer as kt
    from support.common import random_ids

    from keras_transformer.kernels import dense as dense_gradient

    taken = set()
    original = dense_gradient.dense

    def spy(x, kernel, *args, **kwargs):
        taken.add(kernel.path)
        return original(x, kernel, *args, **kwargs)

    monkeypatch.setattr(dense_gradient, "dense", spy)
    model = kt.Transformer(tiny_config)
    model.compile(optimizer="adam", loss=kt.LabelSmoothedCrossEntropy(0.1))
    source, target = random_ids((2, 6)), random_ids((2, 7), seed=1)
    model.train_on_batch((source, target[:, :-1]), target[:, 1:])
    encoder, decoder = tiny_config.num_layers, tiny_config.decoder_layers
    # 4 projections per attention (1 per encoder layer, 2 per decoder layer)
    # and each layer's inner feed-forward layer; the tied output projection
    # is the embedding's.
    assert len(taken) == (encoder * 4 + decoder * 8) + (encoder + decoder)
    assert taken == {layer.kernel.path for layer in model._flatten_layers()
                     if isinstance(layer, Dense) and layer.units >= layer.kernel.shape[0]}
