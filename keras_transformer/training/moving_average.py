"""Validating and keeping an exponential moving average of the weights
(Polyak averaging), kept by the optimizer itself.

A Keras optimizer built with `use_ema=True` (and the default
`ema_overwrite_frequency=None`) keeps, beside every trainable variable, an
average updated after each of its iterations:
`average = ema_momentum * average + (1 - ema_momentum) * weight` (the first
iteration copies the weight). The averages are optimizer variables, so a
training checkpoint holds them and a resumed run continues them exactly;
`model.fit` copies them into the model when it ends.

`ValidateMovingAverage` makes validation, validation BLEU and the best
checkpoints (`BestCheckpoints`) see the averaged weights: the averages swap
into the model as validation begins and swap back once every callback has
seen the end of the epoch, so training goes on from its own weights.
`TrainingRun.callbacks` adds it when the model's optimizer has `use_ema`.
"""

import keras
import tensorflow as tf

from keras_transformer.training.checkpoints import optimizer_step

__all__ = ["ValidateMovingAverage", "moving_average_optimizer", "swap_moving_average"]


def moving_average_optimizer(optimizer):
    """The optimizer that keeps the averages (a `LossScaleOptimizer`'s inner
    one), or None when `optimizer` keeps none."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return inner if getattr(inner, "use_ema", False) else None


def swap_moving_average(optimizer):
    """Exchanges the values of the trainable variables `optimizer` updates and
    of their moving averages; calling it twice restores both. Raises
    `ValueError` for an optimizer without `use_ema` or not built yet."""
    inner = moving_average_optimizer(optimizer)
    if inner is None or not getattr(inner, "built", False):
        raise ValueError("swap_moving_average needs a built optimizer made with "
                         "use_ema=True.")
    for weight, average in zip(inner._trainable_variables,
                               inner._model_variables_moving_average):
        if average is None:  # a variable the optimizer does not average
            continue
        held = tf.identity(weight)
        weight.assign(average)
        average.assign(held)


class ValidateMovingAverage(keras.callbacks.Callback):
    """Validates the optimizer's moving average of the weights instead of the
    weights being trained.

    Put it first in `model.fit`'s callbacks and its `restore` callback last:
    the averages swap into the model at `on_test_begin`, so the validation
    loss, then every `on_epoch_end` in between (validation BLEU, the best
    checkpoints, the logs) see the averaged model; `restore` swaps the
    training weights back at `on_epoch_end`. An epoch without validation
    swaps nothing.

    Args:
        optimizer: the model's optimizer, built with `use_ema=True`.

    Example:

    ```python
    import keras
    import numpy as np
    import keras_transformer as kt

    model = kt.Transformer(kt.get_config("tiny", vocab_size=40))
    model.compile(optimizer=kt.transformer_adam(64, use_ema=True, ema_momentum=0.9),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=0))
    ids = keras.random.randint((8, 6), 4, 40, seed=1)
    average = kt.ValidateMovingAverage(model.optimizer)
    model.fit((ids, ids), ids, batch_size=4, epochs=2, verbose=0,
              validation_data=((ids, ids), ids),
              callbacks=[average, average.restore])
    assert not average.swapped and len(average.validated) == 2
    ```
    """

    def __init__(self, optimizer):
        super().__init__()
        self._averaging = moving_average_optimizer(optimizer)
        if self._averaging is None:
            raise ValueError("ValidateMovingAverage needs an optimizer made with "
                             "use_ema=True (kt-train --ema DECAY).")
        self.optimizer = optimizer
        self.swapped = False
        self.validated = []  # the optimizer steps at which the average was validated
        outer = self

        class Restore(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if outer.swapped:
                    swap_moving_average(outer.optimizer)
                    outer.swapped = False

        self.restore = Restore()

    def on_test_begin(self, logs=None):
        # Unbuilt (evaluate before any update): no averages to swap in yet.
        if not self.swapped and self._averaging.built:
            swap_moving_average(self.optimizer)
            self.swapped = True
            self.validated.append(optimizer_step(self.optimizer))
