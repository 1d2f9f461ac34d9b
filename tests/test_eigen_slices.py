"""keras_transformer/kernels/eigen_slices.py: products in slices of their result's
columns where TensorFlow multiplies float32 with Eigen and the result's
rows are a multiple of 2,048 floats; and the training paths that take them
(`kernels/dense.py`, `kernels/vocabulary_projection.py`, whose own tests are in
`test_vocabulary_projection.py`)."""


import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import dispatch
from keras_transformer.kernels import eigen_slices
from support.common import force_matmul_kernels, train_with_and_without_eigen
from support.float32 import assert_matmul_close

# Compares float results of two computation paths (docs/testing.md#numerics).
pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("width,slice_size,expected", [
    (8192, 1024, [1024] * 8),
    (2048, 1024, [1024, 1024]),
    (4096, 1024, [1024] * 4),
    (32768, 1024, [1024] * 32),
    (10, 4, [4, 3, 3]),
    (3, 4, [3]),
])
def test_slice_sizes(width, slice_size, expected):
    assert eigen_slices.slice_sizes(width, slice_size) == expected


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("width,slice_size", [(10, 4), (12, 4), (7, 16)])
def test_matmul_equals_one_matmul(transpose_a, transpose_b, width, slice_size):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 5)).astype("float32")
    b = rng.normal(size=(5, width)).astype("float32")
    a = a.T if transpose_a else a
    b = b.T if transpose_b else b
    ours = eigen_slices.matmul(a, b, transpose_a, transpose_b, slice_size=slice_size)
    reference = tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert ours.shape == (6, width)
    assert_matmul_close(ours.numpy(), reference.numpy(), a.T if transpose_a else a,
                        b.T if transpose_b else b)


def test_pays_only_for_multiples_of_2048_on_eigen(monkeypatch):
    force_matmul_kernels(monkeypatch, "eigen")
    assert [w for w in (512, 1024, 2000, 2048, 3000, 4000, 4096, 8000, 8192, 32000, 32768, 37000)
            if dispatch.slices_pay(w)] == [2048, 4096, 8192, 32768]
    with dispatch.configured(disabled={"eigen_slices"}):
        assert not dispatch.slices_pay(8192)
    force_matmul_kernels(monkeypatch, "onednn")
    assert not dispatch.slices_pay(8192)


def _eigen(monkeypatch, eigen):
    force_matmul_kernels(monkeypatch, "eigen" if eigen else "onednn")


def _matmuls_in_training_step(layer, x):
    """The `MatMul` ops of one forward and backward pass, traced."""
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * tf.sin(y))
        return [y] + tape.gradient(loss, [x] + [w.value for w in layer.weights])

    graph = step.get_concrete_function(tf.TensorSpec(x.shape, x.dtype)).graph
    return step(x), sum(op.type == "MatMul" for op in graph.get_operations())


@pytest.mark.parametrize("d_in,units,activation,slices", [
    # the inner feed-forward layer of `base`: forward and kernel gradient in
    # 2 slices each, the input gradient whole: 5 products instead of 3
    (8, 2048, "relu", 5),
    # the outer one: the input gradient in 2 slices
    (2048, 8, None, 4),
])
def test_dense_takes_slices_on_eigen_with_keras_values(monkeypatch, d_in, units, activation,
                                                        slices):
    from keras_transformer.layers.dense import Dense

    x = tf.constant(np.random.default_rng(1).normal(size=(6, d_in)).astype("float32"))
    ours = Dense(units, activation=activation)
    theirs = keras.layers.Dense(units, activation=activation)
    ours.build(x.shape)
    theirs.build(x.shape)
    theirs.set_weights(ours.get_weights())
    _eigen(monkeypatch, True)
    sliced, matmuls = _matmuls_in_training_step(ours, x)
    assert matmuls == slices
    whole, keras_matmuls = _matmuls_in_training_step(theirs, x)
    assert keras_matmuls == 3
    for a, b in zip(sliced, whole):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5)

    # Under oneDNN or on a GPU, whole products (and the outer layer takes
    # Keras's own gradient).
    _eigen(monkeypatch, False)
    layer = Dense(units, activation=activation)
    layer.build(x.shape)
    assert _matmuls_in_training_step(layer, x)[1] == 3


def test_model_trains_the_same_in_slices(monkeypatch):
    """A tiny model with a vocabulary and an inner feed-forward width of
    2,048 trains to the same losses and weights through the slices (the
    tied projection's and both feed-forward layers')."""
    import keras_transformer as kt

    config = kt.get_config("tiny", vocab_size=2048, d_ff=2048, dropout=0.0)
    calls = []
    original = eigen_slices.matmul
    monkeypatch.setattr(eigen_slices, "matmul",
                        lambda a, b, *args, **kwargs: calls.append(b.shape) or original(
                            a, b, *args, **kwargs))
    # Attention as it is without Eigen in both runs (`compiled_attention`
    # has its own test), so that only the slices differ.
    monkeypatch.setattr(dispatch, "_settings", dict(dispatch._settings))
    dispatch.configure(disabled={"compiled_attention"})
    runs = train_with_and_without_eigen(monkeypatch, config, calls)
    # In the Eigen run only, per trace of the step: the projection's forward
    # and table gradient, and each feed-forward layer's one (outer: input
    # gradient) or two (inner: kernel gradient; its forward splits the
    # kernel itself).
    layers = config.num_layers + config.decoder_layers
    per_trace = 2 + layers * 2
    traces = len(calls) // per_trace
    assert traces >= 1 and len(calls) == traces * per_trace
    assert calls.count((2048, 64)) == traces * (1 + layers)  # the table; the outer kernels
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-6)
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

