import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.schedules import TransformerSchedule
from keras_transformer.kernels.adam import FusedAdam

SHAPES = [(6, 4), (4,), (10, 3)]


def _run(cls, steps=5, sparse=False, **kwargs):
    """Variables after `steps` updates of `cls` with the paper's schedule,
    and the optimizer."""
    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.normal(size=s).astype("float32")) for s in SHAPES]
    optimizer = cls(learning_rate=TransformerSchedule(16, 3), beta_1=0.9, beta_2=0.98,
                    epsilon=1e-9, **kwargs)

    @tf.function
    def step(grads):
        optimizer.apply(grads, variables)

    for i in range(steps):
        g = np.random.default_rng(100 + i)
        grads = [tf.constant(g.normal(size=s).astype("float32")) for s in SHAPES]
        if sparse:  # rows 1 and 4 of the last variable, as an embedding lookup gives
            grads[-1] = tf.IndexedSlices(tf.constant(g.normal(size=(2, 3)).astype("float32")),
                                         tf.constant([1, 4]), tf.constant([10, 3]))
        step(grads)
    return [v.numpy() for v in variables], optimizer


@pytest.mark.numerics
@pytest.mark.parametrize("options", [
    {}, {"sparse": True}, {"global_clipnorm": 0.5}, {"gradient_accumulation_steps": 2},
    {"weight_decay": 0.01}, {"amsgrad": True},
], ids=lambda o: ",".join(o) or "plain")
def test_equals_keras_adam(options):
    ours, optimizer = _run(FusedAdam, **options)
    theirs, reference = _run(keras.optimizers.Adam, **options)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=5e-7)  # float32 rounding
    assert int(optimizer.iterations.numpy()) == int(reference.iterations.numpy()) > 0
    moved = max(np.abs(a - b).max() for a, b in zip(ours, _run(FusedAdam, steps=0)[0]))
    assert moved > 1e-3


def test_transformer_adam_is_fused_on_tensorflow_and_serializes():
    optimizer = kt.transformer_adam(512)
    assert isinstance(optimizer, FusedAdam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(clone, FusedAdam) and clone.beta_2 == 0.98


def test_checkpoints_are_interchangeable_with_keras_adam(tmp_path):
    # Same slot variables under the same names: a run saved with Keras's
    # Adam resumes with FusedAdam.
    _, keras_adam = _run(keras.optimizers.Adam, steps=2)
    path = tf.train.Checkpoint(optimizer=keras_adam).write(str(tmp_path / "ckpt"))
    fused = FusedAdam(learning_rate=TransformerSchedule(16, 3))
    fused.build([keras.Variable(np.zeros(s, "float32")) for s in SHAPES])
    tf.train.Checkpoint(optimizer=fused).read(path).assert_consumed()
    assert int(fused.iterations.numpy()) == 2
    np.testing.assert_array_equal(fused._momentums[0].numpy(), keras_adam._momentums[0].numpy())
