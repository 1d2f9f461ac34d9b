"""Reuse the package's layers in a model of your own: the Transformer
encoder (paper section 3.1) under a classification head.

`kt.Encoder` is a plain Keras layer: it takes `(batch, length, d_model)`
vectors and a padding mask (here Keras's own, from `mask_zero=True`), so it
drops into any functional or subclassed model. The task is a toy one that
needs attention across the whole sequence: is the token 7 present? A few
hundred updates learn it.

    python examples/encoder_classifier.py --steps 300
"""

import argparse

import keras
import numpy as np

import keras_transformer as kt

VOCAB, LENGTH, D_MODEL = 32, 12, 32


def toy_data(rng, count):
    """Token sequences (0 pads their ends) and whether 7 occurs in each."""
    tokens = rng.integers(1, VOCAB, size=(count, LENGTH))
    lengths = rng.integers(4, LENGTH + 1, size=count)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    labels = (tokens == 7).any(axis=1).astype("int32")
    return tokens.astype("int32"), labels


def classifier():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(tokens)
    x = kt.Encoder(num_layers=2, d_model=D_MODEL, num_heads=4, d_ff=64)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)  # averages the unpadded positions
    return keras.Model(tokens, keras.layers.Dense(2)(x))


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x, y = toy_data(rng, 64 * args.steps)
    x_test, y_test = toy_data(rng, 1000)
    model = classifier()
    model.compile(optimizer=kt.transformer_adam(D_MODEL, warmup_steps=100, scale=2.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    before = model.evaluate(x_test, y_test, verbose=0)[1]
    model.fit(x, y, batch_size=64, epochs=1, verbose=2)
    after = model.evaluate(x_test, y_test, verbose=0)[1]
    print(f"held-out accuracy: {before:.3f} before training, {after:.3f} after")


if __name__ == "__main__":
    main()
