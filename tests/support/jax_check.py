"""Run by tests/test_jax_backend.py in a fresh process with KERAS_BACKEND=jax
(the backend is fixed at import time), as `python -m tests.support.jax_check`
with the repository root on PYTHONPATH (the library comes from the checkout).
Checks that the model needs nothing from TensorFlow: forward and backward
pass, `model.fit`, incremental decoding against the full forward pass, and
beam/greedy search under `jax.jit`. Prints one JSON line of measured facts;
exits non-zero on failure.
"""

import json
import sys

import jax
import keras
import numpy as np

import keras_transformer as kt
from keras_transformer.decoding import beam_search_translate, greedy_translate, sample_translate

assert keras.backend.backend() == "jax", keras.backend.backend()
# TensorFlow must not be needed (it may be installed; it must not be imported).
report = {"tensorflow_imported_before_fit": "tensorflow" in sys.modules}

keras.utils.set_random_seed(0)
config = kt.get_config("tiny", vocab_size=40, dropout=0.0)
model = kt.Transformer(config)
rng = np.random.default_rng(0)
source = rng.integers(4, 40, size=(8, 9)).astype("int32")
source[:, -1] = config.eos_id
source[:3, -3:] = config.pad_id  # some padding
target = rng.integers(4, 40, size=(8, 7)).astype("int32")
target_in = np.concatenate([np.full((8, 1), config.bos_id, "int32"), target[:, :-1]], 1)
logits = model((source, target_in))
assert tuple(logits.shape) == (8, 7, 40), logits.shape

# Backward pass: jax.grad through a stateless call reaches every weight.
loss_fn = kt.LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id)
trainable = [v.value for v in model.trainable_variables]
non_trainable = [v.value for v in model.non_trainable_variables]


def loss_of(trainable):
    y_pred, _ = model.stateless_call(trainable, non_trainable, (source, target_in))
    return loss_fn(target, y_pred)


grads = jax.jit(jax.grad(loss_of))(trainable)  # one program: eager dispatch is slower
norms = [float(np.linalg.norm(np.asarray(g))) for g in grads]
assert all(np.isfinite(norms)), norms
report["weights"] = len(norms)
report["weights_with_zero_gradient"] = [v.path for v, n in zip(model.trainable_variables, norms)
                                        if n == 0.0]

# model.fit on JAX (Keras's JAX trainer calls train_step(state, data)).
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=loss_fn,
              metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
history = model.fit((source, target_in), target, batch_size=4, epochs=30, verbose=0)
report["loss_first_epoch"] = history.history["loss"][0]
report["loss_last_epoch"] = history.history["loss"][-1]
report["accuracy_last_epoch"] = history.history["accuracy"][-1]

# The fixed-shape KV cache gives the full forward pass's logits. In full
# float32: on NVIDIA GPUs JAX's default runs float32 matmuls as TF32 (10-bit
# mantissa), and the two paths, which multiply in different shapes, then
# differ by ~3e-3 (measured on an H100); a tolerance loose enough for that
# would hide a real cache bug.
with jax.default_matmul_precision("float32"):
    full = np.asarray(model((source, target_in), training=False))
    memory, memory_mask = model.encode(source, training=False)
    cache = model.init_decoding_cache(memory, target_in.shape[1])
    steps = []
    decode_step = jax.jit(model.decode_step)  # as the searches call it, compiled once
    for t in range(target_in.shape[1]):
        step_logits, cache = decode_step(target_in[:, t], t, cache, memory_mask)
        steps.append(np.asarray(step_logits))
report["cache_vs_full_max_abs_diff"] = float(np.abs(np.stack(steps, 1) - full).max())

# Searches compile with jax.jit (fixed shapes, no Python-side control flow).
beam = jax.jit(lambda s: beam_search_translate(model, s, beam_size=3, alpha=0.6,
                                                extra_length=4))
sequences, scores = beam(source)
assert sequences.shape[:2] == (8, 3), sequences.shape
assert np.all(np.diff(np.asarray(scores), axis=1) <= 1e-6), "beams not sorted best first"
greedy_ids, _ = jax.jit(lambda s: greedy_translate(model, s, extra_length=4))(source)
# Every beam hypothesis ends with eos within its limit (forced there).
report["beam_hypotheses_end_with_eos"] = bool(
    (np.asarray(sequences) == model.config.eos_id).any(axis=-1).all())
# Sampling under jax.jit: temperature 0 is greedy; a seed gives the same
# samples twice, another seed others.
sample = jax.jit(lambda s, t, seed_noise: sample_translate(
    model, s, temperature=t, top_k=0, top_p=0.9, extra_length=4, noise=seed_noise))
noise = [np.random.default_rng(k).random((8, 64)).astype("float32") for k in (1, 2)]
cold, _ = sample(source, 0.0, noise[0])
first, _ = sample(source, 1.0, noise[0])
again, _ = sample(source, 1.0, noise[0])
other, _ = sample(source, 1.0, noise[1])
report["sampling_at_temperature_0_equals_greedy"] = bool(np.array_equal(
    np.asarray(cold), np.asarray(greedy_ids)))
report["sampling_reproducible"] = bool(np.array_equal(np.asarray(first), np.asarray(again)))
report["sampling_seeds_differ"] = not bool(np.array_equal(np.asarray(first), np.asarray(other)))

# The training-speed layers on JAX (issue 5): 16-bit dropout, the
# closed-form LayerNorm gradient, and `transformer_adam` (Keras's Adam here;
# the fused one is TF-only).
from keras import ops  # noqa: E402

from keras_transformer.layers.dropout import Dropout  # noqa: E402
from keras_transformer.ops.dropout import keep_threshold  # noqa: E402
from keras_transformer.layers.layer_norm import LayerNormalization  # noqa: E402

dropped = np.asarray(Dropout(0.1, seed=1)(np.ones((512, 512), "float32"), training=True))
report["dropout_kept_fraction"] = float((dropped != 0).mean())
report["dropout_mean"] = float(dropped.mean())
report["dropout_expected_kept"] = 1 - keep_threshold(0.1) / 65536
odd = np.asarray(Dropout(0.5, seed=2)(np.ones((3, 5, 7), "float32"), training=True))
report["dropout_odd_shape_ok"] = bool(odd.shape == (3, 5, 7) and 0.2 < (odd != 0).mean() < 0.8)

x = rng.normal(size=(6, 16)).astype("float32") * 2 + 1
ours, theirs = LayerNormalization(1e-6), keras.layers.LayerNormalization(epsilon=1e-6)
ours.build((None, 16))
theirs.build((None, 16))
ours.gamma.assign(rng.normal(1, 0.3, 16).astype("float32"))
theirs.gamma.assign(ours.gamma.numpy())


def norm_loss(x, layer):
    # training=True: our layer's closed-form gradient (Keras's layer ignores it).
    return ops.sum(layer(x, training=True) * ops.arange(16, dtype="float32"))


report["layer_norm_grad_max_abs_diff"] = float(np.abs(
    np.asarray(jax.grad(norm_loss)(x, ours)) - np.asarray(jax.grad(norm_loss)(x, theirs))).max())

keras.utils.set_random_seed(1)
dropout_model = kt.Transformer(kt.get_config("tiny", vocab_size=40, dropout=0.1))
optimizer = kt.transformer_adam(64, warmup_steps=10, scale=4.0)
report["transformer_adam_on_jax"] = type(optimizer).__name__
dropout_model.compile(optimizer=optimizer, loss=loss_fn)
history = dropout_model.fit((source, target_in), target, batch_size=4, epochs=20, verbose=0)
report["dropout_fit_first_loss"] = float(history.history["loss"][0])
report["dropout_fit_last_loss"] = float(history.history["loss"][-1])

# Keras masks (Embedding(mask_zero=True) -> Encoder -> Decoder, no masks
# passed) mean what explicit padding masks mean, eagerly and functionally.
from . import keras_masks  # noqa: E402

report["keras_masks"] = keras_masks.differences_from_explicit_masks(keras_masks.SOURCES,
                                                                   keras_masks.TARGETS)

report["tensorflow_imported"] = "tensorflow" in sys.modules
print(json.dumps(report))
