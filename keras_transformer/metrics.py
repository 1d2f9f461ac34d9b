"""Metrics over real (non-padding) target tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Mean):
    """Fraction of non-padding target tokens whose argmax is the reference.

    Inputs: `y_true (batch, tgt_len)` ids, `y_pred (batch, tgt_len, V)` logits.
    """

    def __init__(self, pad_id=0, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        correct = ops.cast(
            ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true), "float32"
        )
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            if len(sample_weight.shape) == 1:
                sample_weight = ops.expand_dims(sample_weight, -1)
            weights = weights * sample_weight
        return super().update_state(correct, sample_weight=weights)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
