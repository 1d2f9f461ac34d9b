import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.ops.layer_norm import layer_norm


def _pair(d, dtype="float32", seed=0):
    """Our layer and Keras's, built with the same (non-trivial) weights."""
    rng = np.random.default_rng(seed)
    ours = LayerNormalization(epsilon=1e-6, dtype=dtype)
    theirs = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype)
    for layer in (ours, theirs):
        layer.build((None, None, d))
    gamma, beta = rng.normal(1.0, 0.3, d), rng.normal(0.0, 0.3, d)
    for layer in (ours, theirs):
        layer.gamma.assign(gamma.astype("float32"))
        layer.beta.assign(beta.astype("float32"))
    return ours, theirs


def _value_and_grads(layer, x, upstream, training=True):
    """Output and gradients; `training` picks our layer's closed-form
    gradient (True) or autodiff of the same forward ops (False)."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=training)  # Keras's layer takes no `training`; dropped
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma.value, layer.beta.value])
    return [np.asarray(tf.cast(t, tf.float32)) for t in (y, dx, dgamma, dbeta)]


@pytest.mark.parametrize("training", [True, False], ids=["closed_form", "inference"])
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 32), (2, 3, 4, 8)])
def test_values_and_gradients_equal_keras_layer_normalization(shape, training):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=shape) * 3 + 1).astype("float32")
    upstream = rng.normal(size=shape).astype("float32")
    ours, theirs = _pair(shape[-1])
    for a, b in zip(_value_and_grads(ours, x, upstream, training),
                    _value_and_grads(theirs, x, upstream)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def _custom_gradient_ops(function, *args):
    graph = tf.function(function, autograph=False).get_concrete_function(*args).graph
    return [op.name for op in graph.get_operations() if "_gradient_op_type" in op.node_def.attr]


def test_only_training_traces_the_custom_gradient():
    # An inference graph (a served beam search) carries no custom gradient:
    # a SavedModel would have to save it or warn about it on every load.
    ours, _ = _pair(16)
    x = tf.ones((2, 3, 16))
    assert len(_custom_gradient_ops(lambda x: ours(x, training=True), x)) == 1
    assert _custom_gradient_ops(lambda x: ours(x, training=False), x) == []
    assert _custom_gradient_ops(lambda x: ours(x), x) == []


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_a_model_trains_every_norm_with_the_closed_form_and_infers_without(norm_first):
    # Keras's call context carries `training` down to each norm, including
    # the ones ResidualNorm calls outside its own `call`.
    import keras_transformer as kt

    config = kt.get_config("tiny", vocab_size=40, dropout=0.0, norm_first=norm_first)
    model = kt.Transformer(config)
    x = (tf.ones((2, 5), tf.int32), tf.ones((2, 4), tf.int32))
    model(x)
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, LayerNormalization)]
    trained = _custom_gradient_ops(lambda a, b: model((a, b), training=True), *x)
    in_norms = [name for name in trained if re.search(r"norm(_[0-9]+)?/IdentityN$", name)]
    assert len(in_norms) == len(norms) == (10 if not norm_first else 12)
    assert _custom_gradient_ops(lambda a, b: model((a, b), training=False), *x) == []


def test_mixed_bfloat16_keeps_float32_statistics_and_weights():
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(4, 6, 32)) * 5 + 3).astype("float32")
    upstream = rng.normal(size=x.shape).astype("float32")
    ours, theirs = _pair(32, dtype="mixed_bfloat16")
    assert ours.gamma.dtype == "float32" and ours.compute_dtype == "bfloat16"
    y = ours(tf.constant(x), training=True)
    assert y.dtype == tf.bfloat16
    ours_out, theirs_out = _value_and_grads(ours, x, upstream), _value_and_grads(theirs, x, upstream)
    # Outputs and input gradients are bfloat16 (8 significant bits); the
    # weight gradients are float32 sums.
    for a, b in zip(ours_out[:2], theirs_out[:2]):
        np.testing.assert_allclose(a, b, rtol=0.02, atol=0.05)
    for a, b in zip(ours_out[2:], theirs_out[2:]):
        np.testing.assert_allclose(a, b, rtol=0.02, atol=0.5)


def test_weights_have_keras_names_so_checkpoints_carry_over(tmp_path):
    ours, theirs = _pair(8)
    assert [v.name for v in ours.weights] == [v.name for v in theirs.weights] == ["gamma", "beta"]
    checkpoint = tf.train.Checkpoint(norm=theirs)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    fresh = LayerNormalization(epsilon=1e-6)
    fresh.build((None, 8))
    tf.train.Checkpoint(norm=fresh).read(path).assert_consumed()
    np.testing.assert_array_equal(fresh.gamma.numpy(), theirs.gamma.numpy())


def test_gradient_is_finite_for_constant_rows():
    # Zero variance: the epsilon keeps 1/sqrt finite, the gradient is finite.
    x = tf.ones((2, 16))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(layer_norm(x, tf.ones(16), tf.zeros(16), 1e-6) * tf.range(16.0))
    assert np.all(np.isfinite(tape.gradient(loss, x)))


def test_config_round_trip_and_bad_epsilon():
    layer = LayerNormalization(epsilon=1e-5, name="n")
    clone = LayerNormalization.from_config(layer.get_config())
    assert clone.epsilon == 1e-5
    with pytest.raises(ValueError, match="epsilon"):
        LayerNormalization(epsilon=0.0)
    with pytest.raises(ValueError, match="last axis"):
        LayerNormalization().build((None, None))
