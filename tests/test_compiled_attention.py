"""keras_transformer/kernels/attention.py: scaled dot-product attention as
one XLA function in float32 training where TensorFlow multiplies with Eigen."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.kernels import attention as compiled_attention
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.masks import causal_mask
from keras_transformer.ops.attention import scaled_dot_product_attention
from support.common import force_matmul_kernels, train_with_and_without_eigen


def _eigen(monkeypatch, eigen):
    force_matmul_kernels(monkeypatch, "eigen" if eigen else "onednn")


def _spy(monkeypatch):
    calls = []
    original = compiled_attention.attention
    monkeypatch.setattr(compiled_attention, "attention",
                        lambda *args: calls.append(args[0].shape) or original(*args))
    return calls


@pytest.mark.parametrize("mask", ["causal", "padding", None])
def test_values_and_gradients_equal_the_keras_ops_attention(mask):
    rng = np.random.default_rng(0)
    q, k, v = (tf.constant(rng.normal(size=(2, 3, 5, 4)).astype("float32")) for _ in range(3))
    upstream = tf.constant(rng.normal(size=(2, 3, 5, 4)).astype("float32"))
    if mask == "causal":
        mask = tf.cast(causal_mask(5), tf.bool)
    elif mask == "padding":
        mask = tf.constant([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    results = []
    for attend in (compiled_attention.attention,
                   lambda q, k, v, m: scaled_dot_product_attention(q, k, v, m)[0]):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            out = attend(q, k, v, mask)
            loss = tf.reduce_sum(out * upstream)
        results.append([out.numpy()] + [g.numpy() for g in tape.gradient(loss, [q, k, v])])
    for ours, reference in zip(*results):
        assert ours.shape == reference.shape
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


def _layer_outputs(layer, x, mask, training, weights=False):
    with tf.GradientTape() as tape:
        tape.watch(x)
        out, attention = layer(x, x, x, mask, training=training,
                               return_attention_weights=weights)
        loss = tf.reduce_sum(out * tf.sin(out))
    gradients = tape.gradient(loss, [x] + [w.value for w in layer.weights])
    return [out.numpy()] + [g.numpy() for g in gradients], attention


def test_multi_head_attention_trains_compiled_on_eigen(monkeypatch):
    calls = _spy(monkeypatch)
    x = tf.constant(np.random.default_rng(1).normal(size=(2, 5, 8)).astype("float32"))
    mask = tf.cast(causal_mask(5), tf.bool)
    layer = MultiHeadAttention(8, 2)
    layer.build(x.shape)
    _eigen(monkeypatch, False)
    reference, _ = _layer_outputs(layer, x, mask, training=True)
    assert calls == []
    _eigen(monkeypatch, True)
    compiled, weights = _layer_outputs(layer, x, mask, training=True)
    assert calls == [(2, 2, 5, 4)] and weights is None
    for a, b in zip(compiled, reference):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_only_where_it_pays(monkeypatch):
    """Not at inference, not when the weights are asked for, not with
    dropout on them, not in bfloat16, not where oneDNN or a GPU multiplies."""
    calls = _spy(monkeypatch)
    x = tf.ones((2, 5, 8))
    _eigen(monkeypatch, True)
    layer = MultiHeadAttention(8, 2)
    layer(x, x, x, training=False, return_attention_weights=False)
    _, weights = layer(x, x, x, training=True, return_attention_weights=True)
    assert weights.shape == (2, 2, 5, 5)
    MultiHeadAttention(8, 2, dropout=0.1)(x, x, x, training=True, return_attention_weights=False)
    MultiHeadAttention(8, 2, dtype="mixed_bfloat16")(x, x, x, training=True,
                                                     return_attention_weights=False)
    assert calls == []
    _eigen(monkeypatch, False)
    layer(x, x, x, training=True, return_attention_weights=False)
    assert calls == []
    _eigen(monkeypatch, True)
    layer(x, x, x, training=True, return_attention_weights=False)
    assert len(calls) == 1


def test_model_trains_the_same_compiled(monkeypatch):
    """Every attention of a training step (encoder self-attention, decoder
    self- and cross-attention) compiled; losses and weights as without."""
    import keras_transformer as kt

    config = kt.get_config("tiny", vocab_size=40, dropout=0.0)
    calls = _spy(monkeypatch)
    runs = train_with_and_without_eigen(monkeypatch, config, calls)
    attentions = config.num_layers + 2 * config.decoder_layers
    assert calls and len(calls) % attentions == 0  # each traced step, all of them
    np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-5)
    for a, b in zip(runs[True][1], runs[False][1]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
