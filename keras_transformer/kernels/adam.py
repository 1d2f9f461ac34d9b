"""Keras's Adam with each variable's update as one TensorFlow kernel.

Keras 3's `Adam.update_step` is written in `keras.ops`: on TensorFlow that
is about 30 small ops per variable (reads, casts, two `pow`s for the bias
correction, the moment updates, three assignments), each paying the graph
executor's dispatch cost; a Transformer has over a hundred weight tensors.

`ResourceApplyAdam` computes the same update in one kernel:

    lr_t = lr * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
    m = m + (g - m) * (1 - beta_1)
    v = v + (g * g - v) * (1 - beta_2)
    w = w - lr_t * m / (sqrt(v) + epsilon)

which is Keras's formula term for term (epsilon outside the square root, as
in Keras and the paper's TF implementation). `tests/test_fused_adam.py`
checks the two against each other, alone and under `MirroredStrategy`.

Everything around `update_step` is Keras's: gradient clipping, weight decay,
gradient accumulation, `tf.distribute` (Keras calls `update_step` inside
`strategy.extended.update`, once per variable and device), the variables
and their checkpoint names. AMSGrad is left to Keras.
"""


import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose per-variable update is TensorFlow's
    fused `ResourceApplyAdam` (TensorFlow backend only; same arguments,
    same results)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if keras.backend.backend() != "tensorflow":
            raise RuntimeError(
                "FusedAdam runs TensorFlow kernels; with the "
                f"{keras.backend.backend()!r} backend use keras.optimizers.Adam."
            )

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        # A sparse gradient (an untied embedding) is applied densely, as
        # Keras's Adam does: both moments decay at every row.
        gradient = tf.cast(tf.convert_to_tensor(gradient), dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=gradient,
        )


def _handle(variable):
    """The resource handle of a Keras or TF variable; for a distributed
    variable, inside `strategy.extended.update`, the current device's."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
