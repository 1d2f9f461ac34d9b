import keras
import numpy as np
import pytest

from keras_transformer.layers import MultiHeadAttention, scaled_dot_product_attention
from keras_transformer.layers.masks import cache_mask, causal_mask, keras_mask, padding_mask


@pytest.mark.numerics
def test_scaled_dot_product_attention_matches_numpy():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, s, 4)).astype("float32") for s in (5, 6, 6))
    mask = rng.random((2, 1, 5, 6)) > 0.3
    mask[..., 0] = True
    out, w = scaled_dot_product_attention(q, k, v, mask)
    logits = q @ k.swapaxes(-1, -2) / 2.0
    logits = np.where(mask, logits, -np.inf)
    expected_w = np.exp(logits - logits.max(-1, keepdims=True))
    expected_w /= expected_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(w, expected_w, atol=1e-6)
    np.testing.assert_allclose(out, expected_w @ v, atol=1e-5)
    assert np.all(np.asarray(w)[~np.broadcast_to(mask, w.shape)] == 0)


def test_a_single_key_gets_weight_one_without_a_softmax_warning():
    # The first step of a decoding loop that re-runs the model on the growing
    # target: self-attention over one key. Keras's softmax warns on a size-1
    # axis; the weight is 1 (masked or not, since the mask value is finite),
    # and a NaN logit still gives NaN.
    import warnings

    import keras_transformer as kt

    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 3, s, 4)).astype("float32") for s in (1, 1, 1))
    for mask in (None, np.array([True, False]).reshape(2, 1, 1, 1)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out, w = scaled_dot_product_attention(q, k, v, mask)
        np.testing.assert_array_equal(w, np.ones((2, 3, 1, 1), "float32"))
        np.testing.assert_allclose(out, v, atol=1e-6)
    _, w = scaled_dot_product_attention(np.full_like(q, np.nan), k, v)
    assert np.all(np.isnan(w))

    model = kt.Transformer(kt.get_config("tiny", vocab_size=40))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits = model((np.ones((2, 5), "int32"), np.ones((2, 1), "int32")))
    assert logits.shape == (2, 1, 40)


def _copy_into_keras_mha(ours, d_model, heads):
    depth = d_model // heads
    theirs = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=depth)
    x = np.zeros((1, 2, d_model), "float32")
    theirs(x, x, x)
    for dense, target in ((ours.wq, theirs._query_dense), (ours.wk, theirs._key_dense),
                          (ours.wv, theirs._value_dense)):
        kernel, bias = dense.get_weights()
        target.set_weights([kernel.reshape(d_model, heads, depth), bias.reshape(heads, depth)])
    kernel, bias = ours.dense.get_weights()
    theirs._output_dense.set_weights([kernel.reshape(heads, depth, d_model), bias])
    return theirs


@pytest.mark.numerics
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("weights", [True, False])
def test_multi_head_attention_equals_keras_layer(with_mask, weights):
    d_model, heads = 16, 4
    rng = np.random.default_rng(1)
    q = rng.normal(size=(2, 5, d_model)).astype("float32")
    kv = rng.normal(size=(2, 7, d_model)).astype("float32")
    ours = MultiHeadAttention(d_model, heads)
    ours(kv, kv, q)
    theirs = _copy_into_keras_mha(ours, d_model, heads)
    mask = None
    if with_mask:
        mask = rng.random((2, 5, 7)) > 0.4
        mask[..., 0] = True
    expected, expected_w = theirs(q, kv, kv, attention_mask=mask, return_attention_scores=True)
    out, w = ours(kv, kv, q, None if mask is None else mask[:, None],
                  return_attention_weights=weights)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    if weights:
        assert tuple(w.shape) == (2, heads, 5, 7)
        np.testing.assert_allclose(w, expected_w, atol=1e-5)
    else:
        assert w is None


def test_multi_head_attention_validates_and_serializes():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    layer = MultiHeadAttention(8, 2, dropout=0.1)
    clone = MultiHeadAttention.from_config(layer.get_config())
    assert (clone.d_model, clone.num_heads, clone.dropout) == (8, 2, 0.1)


def test_mask_by_keyword_is_an_attention_mask_not_a_keras_mask():
    # Keras reads `mask=` as the input's Keras mask: without `compute_mask`
    # it warns that the layer "will destroy the mask information".
    import warnings

    layer = MultiHeadAttention(8, 2)
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    mask = np.array([True, True, False])[None, None, None, :]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_keyword, weights = layer(x, x, x, mask=mask)
        positional, _ = layer(x, x, x, mask)
    np.testing.assert_array_equal(by_keyword, positional)
    np.testing.assert_array_equal(np.asarray(weights)[..., 2], 0.0)
    assert keras_mask(by_keyword) is None


def test_masks_mean_visible():
    ids = np.array([[5, 6, 0, 0]])
    np.testing.assert_array_equal(padding_mask(ids, 0)[0, 0, 0], [True, True, False, False])
    causal = np.asarray(causal_mask(3))[0, 0]
    np.testing.assert_array_equal(causal, np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(cache_mask(2, 5)[0, 0, 0], [True, True, True, False, False])
