"""The paper's learning-rate schedule (section 5.3)."""

import keras
from keras import ops

from keras_transformer import dispatch


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Linear warm-up for `warmup_steps`, then decay with the inverse square root
    of the step. Keras passes the optimizer's 0-based iteration count; the
    paper's step numbers start at 1, so `step = iterations + 1` (which also
    makes the schedule finite at iteration 0).

    Args:
        d_model: model width.
        warmup_steps: 4000 in the paper.
        scale: a multiplier (1.0 in the paper; larger for small batches).

    Example:

    ```python
    import keras_transformer as kt

    schedule = kt.TransformerSchedule(d_model=512, warmup_steps=4000)
    peak = float(schedule(3999))                        # step 4000, the peak
    assert float(schedule(0)) < peak and float(schedule(20000)) < peak
    ```
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                "`d_model` and `warmup_steps` must be positive, received "
                f"{d_model}, {warmup_steps}."
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        return (
            self.scale
            * self.d_model**-0.5
            * ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        )

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def transformer_adam(d_model, warmup_steps=4000, scale=1.0, **kwargs):
    """Adam with the paper's beta1=0.9, beta2=0.98, eps=1e-9 and schedule.

    On TensorFlow, Keras's Adam with each variable's update in one kernel,
    with the same results (`keras_transformer.dispatch.adam_class`).

    Example:

    ```python
    import keras_transformer as kt

    optimizer = kt.transformer_adam(d_model=512, warmup_steps=4000)
    assert optimizer.beta_2 == 0.98
    ```
    """
    return dispatch.adam_class()(
        learning_rate=TransformerSchedule(d_model, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        **kwargs,
    )
