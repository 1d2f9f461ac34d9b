"""The encoder's and decoder's common base (layers/transformer_layer.py)."""

import inspect

import keras
import numpy as np
import pytest

from keras_transformer.layers import Decoder, DecoderLayer, Encoder, EncoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.masks import keras_mask, padding_mask
from keras_transformer.layers.residual import ResidualNorm
from support import keras_masks

SIZES = dict(d_model=8, num_heads=2, d_ff=12, dropout=0.2, attention_dropout=0.1,
             activation_dropout=0.05, norm_first=True, epsilon=1e-5)


def inputs(cls):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    memory = rng.normal(size=(2, 4, 8)).astype("float32")
    return (x, memory) if cls in (DecoderLayer, Decoder) else (x,)


@pytest.mark.parametrize("cls, extra", [(EncoderLayer, {}), (DecoderLayer, {}),
                                        (Encoder, dict(num_layers=2)),
                                        (Decoder, dict(num_layers=3))])
def test_serializes_every_argument(cls, extra):
    layer = cls(**extra, **SIZES, name="under_test")
    args = inputs(cls)
    expected = layer(*args)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is cls
    config = clone.get_config()
    assert {k: config[k] for k in {**extra, **SIZES}} == {**extra, **SIZES}
    clone(*args)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone(*args), expected)
    if "num_layers" in extra:
        assert len(clone.weights) == len(layer.weights)
        assert clone.final_norm is not None  # norm_first
    # The arguments are in the signature (help(), IDEs), not behind *args.
    assert set(inspect.signature(cls).parameters) >= set(extra) | set(SIZES)


def test_weights_follow_the_order_the_sublayers_run():
    # Checkpoints average, and the trainer's weights digest hashes, weights
    # in this order: it must not move when the layers are refactored.
    layer = DecoderLayer(**SIZES)
    layer(*inputs(DecoderLayer))
    sublayers = [w.path.split("/")[1] for w in layer.weights]
    assert list(dict.fromkeys(sublayers)) == [
        "self_attention", "self_attention_block", "cross_attention",
        "cross_attention_block", "feed_forward", "feed_forward_block"]
    stack = Decoder(num_layers=2, **SIZES)
    stack(*inputs(Decoder))
    assert list(dict.fromkeys(w.path.split("/")[1] for w in stack.weights)) == [
        "layer_0", "layer_1", "final_norm"]


@pytest.mark.parametrize("cls", [Encoder, Decoder])
def test_stacks_take_masks_or_none_without_warnings(cls):
    import warnings

    stack = cls(num_layers=2, **SIZES)
    args = inputs(cls)
    keys = args[-1].shape[1]
    mask = np.arange(keys)[None, None, None, :] < np.array([keys, 2])[:, None, None, None]
    masks = dict(mask=mask) if cls is Encoder else dict(memory_mask=mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unmasked = np.asarray(stack(*args))
        masked = np.asarray(stack(*args, **masks))
        if cls is Encoder:  # as the Transformer calls it, and one layer
            np.testing.assert_array_equal(stack(args[0], mask), masked)
            stack.encoder_layers[0](args[0], mask=mask)
    np.testing.assert_array_equal(masked[0], unmasked[0])  # row 0 masks nothing
    assert not np.allclose(masked[1], unmasked[1])


def test_keras_masks_are_padding_masks_in_the_stacks():
    # Embedding(mask_zero=True) -> Encoder -> Decoder with no masks passed:
    # Keras hands the stacks `(batch, len)` masks, which must mean what the
    # explicit padding masks mean, eagerly and in a functional model.
    result = keras_masks.differences_from_explicit_masks(keras_masks.SOURCES,
                                                         keras_masks.TARGETS)
    assert result["encoder_eager"] < 1e-6
    assert result["decoder_eager"] < 1e-6
    assert result["decoder_functional"] < 1e-6
    assert result["encoder_output_mask_kept"]


@pytest.mark.numerics
@pytest.mark.parametrize("batch", [3, 2])  # batch == src_len broadcast silently
def test_keras_masks_are_padding_masks_in_single_layers(batch):
    # Pre-LN (SIZES): the masked input reaches the norm, dropout and
    # feed-forward sub-layers too, which pass Keras masks on rather than
    # warning that they destroy them.
    import warnings

    ids = keras_masks.SOURCES[:batch]
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    x = embedding(ids)
    plain = keras.ops.convert_to_tensor(np.asarray(x))
    mask = padding_mask(ids, keras_masks.PAD)
    encoder_layer = EncoderLayer(**dict(SIZES, dropout=0.0))
    decoder_layer = DecoderLayer(**dict(SIZES, dropout=0.0))
    target = np.ones((batch, 2, 8), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoded = encoder_layer(x)
        decoded = decoder_layer(target, x)
    np.testing.assert_allclose(encoded, encoder_layer(plain, mask=mask), atol=1e-6)
    np.testing.assert_array_equal(keras_mask(encoded), ids != keras_masks.PAD)
    np.testing.assert_allclose(decoded, decoder_layer(target, plain, memory_mask=mask), atol=1e-6)


@pytest.mark.numerics
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_keras_masks_survive_the_mixed_precision_input_cast(policy):
    # A float32 embedding (e.g. one kept in float32 for its table) feeding
    # the stacks under a mixed policy: Keras casts the input to the compute
    # dtype, a new tensor without the mask; the mask must still reach the
    # attention and the output.
    keras.config.set_dtype_policy(policy)
    ids = keras_masks.SOURCES
    x = keras.layers.Embedding(10, 8, mask_zero=True, dtype="float32")(ids)
    plain = keras.ops.convert_to_tensor(np.asarray(x))
    mask = padding_mask(ids, keras_masks.PAD)
    encoder = Encoder(num_layers=2, **dict(SIZES, dropout=0.0))
    decoder = Decoder(num_layers=1, **dict(SIZES, dropout=0.0))
    target = np.ones((len(ids), 2, 8), "float32")
    encoded, decoded = encoder(x), decoder(target, x)
    assert keras.backend.standardize_dtype(encoded.dtype) == policy.split("_")[1]
    np.testing.assert_array_equal(keras_mask(encoded), ids != keras_masks.PAD)
    np.testing.assert_array_equal(encoded, encoder(plain, mask=mask))
    np.testing.assert_array_equal(decoded, decoder(target, plain, memory_mask=mask))
    assert not np.array_equal(encoded, encoder(plain))  # the mask matters here


@pytest.mark.parametrize("make, extra", [
    (lambda: LayerNormalization(), ()),
    (lambda: Dropout(0.5), ()),
    (lambda: PositionwiseFeedForward(8, 12), ()),
    (lambda: ResidualNorm(0.1), (np.ones((2, 3, 8), "float32"),)),
])
def test_position_wise_sublayers_keep_keras_masks(make, extra):
    import warnings

    ids = keras_masks.SOURCES[:2]
    x = keras.layers.Embedding(10, 8, mask_zero=True)(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = make()(x, *extra, training=True)
    np.testing.assert_array_equal(keras_mask(y), ids != keras_masks.PAD)


def test_a_two_dimensional_mask_of_other_sizes_is_rejected():
    x = np.zeros((2, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"\(batch, k_len\)` = \(2, 3\).*received shape \(3, 3\)"):
        Encoder(num_layers=1, **SIZES)(x, mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="Keras mask over the keys' positions"):
        DecoderLayer(**SIZES)(x, x[:, :2], memory_mask=np.ones((2, 3), bool))


def test_post_ln_stacks_have_no_final_norm_and_reject_empty_stacks():
    assert Encoder(num_layers=1, **dict(SIZES, norm_first=False)).final_norm is None
    with pytest.raises(ValueError, match="`num_layers` must be positive, received 0"):
        Decoder(num_layers=0, **SIZES)


def test_stack_layers_are_attributes_for_tensorflow_checkpoints():
    stack = Encoder(num_layers=2, **SIZES)
    assert [stack.layer_0, stack.layer_1] == stack.encoder_layers
