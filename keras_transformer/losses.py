"""Label-smoothed cross-entropy (paper section 5.4, "Label Smoothing") as a
Keras loss, and the token weights that normalise it."""

import functools

import keras
from keras import ops

from keras_transformer import dispatch


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against `(1 - eps)` on the reference token and
    `eps / (V - 1)` on every other token, per target token.

    The constant entropy of that smoothed distribution is subtracted, so the
    value is KL(smoothed || model): 0 for a perfect model, with the same
    gradients as the plain smoothed cross-entropy (Model Garden and T2T report
    it this way).

    `call` returns one value per token, `(batch, tgt_len)`, and 0 at padding.
    Reduction is left to Keras ("sum_over_batch_size"), which under
    `tf.distribute` also divides by the number of replicas; a loss that
    reduced itself to a scalar would skip that and be off by the replica count.
    `sample_weight`, when given, is the per-token weight (the `Transformer`
    passes weights that normalise by the global number of target tokens);
    without it, padding is excluded and the mean is over real tokens.

    Args:
        label_smoothing: eps_ls (0.1 in the paper).
        pad_id: target padding id (from the tokenizer).

    Inputs: `y_true (batch, tgt_len)` int ids, `y_pred (batch, tgt_len, V)` logits.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    loss = kt.LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=0)
    y_true = keras.ops.convert_to_tensor([[5, 6, 0]])    # the 0 is padding
    y_pred = keras.random.normal((1, 3, 10))
    assert float(loss(y_true, y_pred)) > 0
    ```
    """

    def __init__(self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy",
                 reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1), received {label_smoothing}."
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id
        self._per_token_loss = functools.partial(
            dispatch.label_smoothed_cross_entropy, label_smoothing=label_smoothing,
            pad_id=pad_id)

    def call(self, y_true, y_pred):
        return self._per_token_loss(y_true, y_pred)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is None:
            weights = real_token_weights(y_true, self.pad_id)
            sample_weight = normalizing_weights(weights, ops.sum(weights))
        return super().__call__(y_true, y_pred, sample_weight=sample_weight)

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, pad_id=self.pad_id)
        return config


def real_token_weights(y_true, pad_id, sample_weight=None):
    """1 at real target tokens, 0 at padding, times `sample_weight`
    (`(batch,)` or `(batch, tgt_len)`) when given. Returns `(batch, tgt_len)`."""
    weights = ops.cast(ops.not_equal(y_true, pad_id), "float32")
    if sample_weight is not None:
        sample_weight = ops.cast(sample_weight, "float32")
        if len(sample_weight.shape) == 1:
            sample_weight = ops.expand_dims(sample_weight, -1)
        weights = weights * sample_weight
    return weights


def normalizing_weights(weights, total_tokens, num_replicas=1):
    """Rescales per-token `weights` so that a "sum_over_batch_size" loss
    equals `sum(loss * weights) / total_tokens`.

    Keras divides such a loss by the element count `batch * tgt_len` and,
    under `tf.distribute`, by the replica count; this undoes both. Pass the
    token count summed over replicas as `total_tokens` so that one replica's
    short batch does not bias the mean.
    """
    elements = ops.cast(ops.size(weights), "float32")
    return weights * ops.divide_no_nan(elements * num_replicas, total_tokens)
