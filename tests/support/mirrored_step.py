"""Run as `python -m tests.support.mirrored_step` from the repository root
(a fresh process, so the CPU can be split into two logical devices before
TensorFlow initialises): one training step under
`MirroredStrategy` on CPU:0 and CPU:1, each replica with its own batch of a
different token count, against the same step on one device with both
batches in one. Prints JSON with the largest loss and weight differences."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer.training.strategy import make_strategy  # noqa: E402

strategy = make_strategy("mirrored", logical_cpus=2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.data.batching import distributed_dataset  # noqa: E402


def make_batch(rng, batch, src_len, tgt_len, pad_tail):
    """Ids in [4, 40), padding (id 0) at the end of the last rows."""
    src = rng.integers(4, 40, (batch, src_len)).astype("int32")
    tgt = rng.integers(4, 40, (batch, tgt_len)).astype("int32")
    src[-1, src_len - pad_tail:] = 0
    tgt[-1, tgt_len - pad_tail:] = 0
    tgt_in = np.concatenate([np.full((batch, 1), 2, "int32"), tgt[:, :-1]], axis=1)
    return src, tgt_in, tgt


def pad_to(x, length):
    return np.pad(x, ((0, 0), (0, length - x.shape[1])))


rng = np.random.default_rng(0)
a = make_batch(rng, 3, 9, 7, 2)   # replica 0: 3 x 7 target positions
b = make_batch(rng, 5, 5, 11, 4)  # replica 1: 5 x 11, different token count
config = kt.get_config("tiny", vocab_size=40, dropout=0.0, num_layers=1)


def build(scope, optimizer=None):
    with scope:
        model = kt.Transformer(config)
        # Plain SGD with a large rate: the update is the gradient itself, so
        # a wrongly scaled or normalised gradient shows in the weights.
        model.compile(optimizer=optimizer() if optimizer else keras.optimizers.SGD(1.0),
                      loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=0))
        model.build()
    return model


keras.utils.set_random_seed(7)
single = build(tf.distribute.OneDeviceStrategy("CPU:0").scope())
mirrored = build(strategy.scope())
initial_weights = single.get_weights()
mirrored.set_weights(initial_weights)

# One device: both batches in one, padded to common lengths.
src_len = max(a[0].shape[1], b[0].shape[1])
tgt_len = max(a[2].shape[1], b[2].shape[1])
joined = [np.concatenate([pad_to(x, n), pad_to(y, n)])
          for x, y, n in zip(a, b, (src_len, tgt_len, tgt_len))]
single_history = single.fit((joined[0], joined[1]), joined[2], batch_size=8, epochs=1,
                            verbose=0, shuffle=False)


def dataset_fn(context):
    # Consecutive batches go to consecutive replicas: a to CPU:0, b to CPU:1.
    parts = [tf.data.Dataset.from_tensors(((x[0], x[1]), x[2])) for x in (a, b)]
    return parts[0].concatenate(parts[1])


mirrored_history = mirrored.fit(distributed_dataset(strategy, dataset_fn), steps_per_epoch=1,
                                epochs=1, verbose=0)

diffs = [float(np.max(np.abs(x - y))) for x, y in zip(single.get_weights(),
                                                      mirrored.get_weights())]
initial = build(tf.distribute.OneDeviceStrategy("CPU:0").scope())
initial.set_weights(initial_weights)
moved = max(float(np.max(np.abs(x - y))) for x, y in zip(single.get_weights(),
                                                          initial.get_weights()))

# The fused Adam (`kt.transformer_adam` on TF) against Keras's Adam, both
# mirrored, from the same weights over two steps: the gradients are the same,
# so any difference is the update kernel. Each mirrored variable's copies on
# CPU:0 and CPU:1 must stay identical (the fused kernel writes one device's
# copy per call, inside `strategy.extended.update`).
def adam(fused):
    if fused:
        return kt.transformer_adam(config.d_model, warmup_steps=2)
    return keras.optimizers.Adam(kt.TransformerSchedule(config.d_model, 2), beta_1=0.9,
                                 beta_2=0.98, epsilon=1e-9)


adams = {}
for fused in (True, False):
    model = build(strategy.scope(), lambda fused=fused: adam(fused))
    model.set_weights(initial_weights)
    model.fit(distributed_dataset(strategy, dataset_fn), steps_per_epoch=1, epochs=2, verbose=0)
    adams[fused] = model
fused_model = adams[True]
copies_diff = max(float(np.max(np.abs(c.numpy() - v.value.values[0].numpy())))
                  for v in fused_model.trainable_variables for c in v.value.values)
fused_diff = max(float(np.max(np.abs(x - y))) for x, y in zip(fused_model.get_weights(),
                                                              adams[False].get_weights()))
fused_update = max(float(np.max(np.abs(x - y))) for x, y in zip(fused_model.get_weights(),
                                                                initial_weights))

print("RESULT " + json.dumps({
    "fused_adam_optimizer": type(fused_model.optimizer).__name__,
    "fused_adam_vs_keras_adam_max_weight_diff": fused_diff,
    "fused_adam_max_update": fused_update,
    "fused_adam_replica_copies_max_diff": copies_diff,
    "replicas": strategy.num_replicas_in_sync,
    "single_loss": float(single_history.history["loss"][0]),
    "mirrored_loss": float(mirrored_history.history["loss"][0]),
    "max_weight_diff": max(diffs),
    "max_update": moved,
}))
