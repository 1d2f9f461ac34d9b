"""Metrics over real (non-padding) target tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Mean):
    """Fraction of non-padding target tokens whose argmax is the reference.

    Inputs: `y_true (batch, tgt_len)` ids, `y_pred (batch, tgt_len, V)` logits.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    accuracy = kt.MaskedAccuracy(pad_id=0)
    y_true = keras.ops.convert_to_tensor([[1, 2, 0]])
    y_pred = keras.ops.one_hot(keras.ops.convert_to_tensor([[1, 3, 3]]), 4)
    accuracy.update_state(y_true, y_pred)
    assert float(accuracy.result()) == 0.5    # padding is not counted
    ```
    """

    def __init__(self, pad_id=0, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        correct = ops.cast(ops.equal(argmax_last_axis(y_pred), y_true), "float32")
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        return super().update_state(correct, sample_weight=weights)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


def argmax_last_axis(x):
    """`ops.argmax(x, axis=-1)` as int32 (ties go to the lowest index),
    without Keras's negative-zero rewrite on TensorFlow.

    Keras's `ops.argmax` first replaces -0.0 by minus the smallest normal
    float, so that -0.0 ranks below +0.0 on every backend
    (jax-ml/jax#24280). JAX compiles the step whole, so XLA can fuse that
    into the reduction; TensorFlow's executor runs it as five more
    elementwise ops over the whole tensor (equal, sign bit, and, select),
    several times the cost of `tf.argmax` alone (docs/performance.md).
    The two differ only where a row's maximum is 0.0
    held by both a -0.0 and a +0.0, which an accuracy over logits can
    ignore.

    Args:
        x: `(..., n)` float.

    Returns: `(...)` int32.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.argmax(x, axis=-1, output_type=tf.int32)
    return ops.cast(ops.argmax(x, axis=-1), "int32")
