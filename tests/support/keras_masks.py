"""A sequence model built the Keras way around our stacks: token ids ->
`keras.layers.Embedding(mask_zero=True)` -> `Encoder` -> `Decoder`, with
no masks passed, so every mask the stacks use is a Keras mask that Keras
hands them. Backend-neutral: run by tests/test_transformer_layer.py and, on
JAX, by tests/support/jax_check.py."""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers import Decoder, Encoder
from keras_transformer.layers.masks import keras_mask, padding_mask

PAD = 0


def differences_from_explicit_masks(sources, targets):
    """Runs the stacks on `sources` `(batch, src_len)` and `targets`
    `(batch, tgt_len)` ids (PAD = 0) three ways: eagerly on embeddings that
    carry Keras masks, through a functional `keras.Model`, and eagerly with
    the padding masks passed explicitly (the reference).

    Returns: max abs differences from the reference (`encoder_eager`,
    `decoder_eager`, `decoder_functional`) and whether the encoder's output
    carries its input's Keras mask (`encoder_output_mask_kept`).
    """
    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(10, 16, mask_zero=True)
    encoder = Encoder(num_layers=2, d_model=16, num_heads=2, d_ff=32)
    decoder = Decoder(num_layers=2, d_model=16, num_heads=2, d_ff=32)

    source_in = keras.Input((None,), dtype="int32")
    target_in = keras.Input((None,), dtype="int32")
    functional = keras.Model(
        [source_in, target_in],
        decoder(embedding(target_in), encoder(embedding(source_in))))

    memory = encoder(embedding(sources))
    decoded = decoder(embedding(targets), memory)

    def unmasked(x):  # the same values with no Keras mask attached
        return ops.convert_to_tensor(np.asarray(x))

    source_mask = padding_mask(sources, PAD)
    expected_memory = encoder(unmasked(embedding(sources)), mask=source_mask)
    expected = decoder(unmasked(embedding(targets)), expected_memory, memory_mask=source_mask)

    def difference(a, b):
        return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))

    mask = keras_mask(memory)
    return {
        "encoder_eager": difference(memory, expected_memory),
        "decoder_eager": difference(decoded, expected),
        "decoder_functional": difference(functional([sources, targets]), expected),
        "encoder_output_mask_kept": mask is not None and bool(
            np.array_equal(np.asarray(mask), sources != PAD)),
    }


# Batch 3 and 3 source positions: a Keras mask taken as an attention mask
# would broadcast as (q_len, k_len) without an error.
SOURCES = np.array([[3, 4, 0], [5, 0, 0], [1, 2, 6]], "int32")
TARGETS = np.array([[1, 2], [7, 8], [9, 0]], "int32")
