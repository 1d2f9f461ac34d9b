"""Label-smoothed cross-entropy (paper section 5.4, "Label Smoothing")."""

import functools
import math

import keras
from keras import ops


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
        if keras.backend.backend() == "tensorflow":
            # Two XLA clusters with the gradient written out
            # (`keras_transformer/fused_cross_entropy.py`); the same values.
            from keras_transformer import fused_cross_entropy

            loss_fn = fused_cross_entropy.label_smoothed_cross_entropy
        else:
            loss_fn = label_smoothed_cross_entropy  # JAX compiles the whole step
        self._per_token_loss = functools.partial(
            loss_fn, label_smoothing=label_smoothing, pad_id=pad_id)

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


def label_smoothed_cross_entropy(y_true, y_pred, label_smoothing, pad_id):
    """Per-token KL(smoothed target || model), the value of
    `LabelSmoothedCrossEntropy` before reduction.

    Args:
        y_true: `(batch, tgt_len)` int ids.
        y_pred: `(batch, tgt_len, V)` logits (any float dtype).
        label_smoothing: eps_ls.
        pad_id: ids that get 0.

    Returns: `(batch, tgt_len)` float32.
    """
    y_true = ops.cast(y_true, "int32")
    logits = ops.cast(y_pred, "float32")
    vocab_size = ops.shape(logits)[-1]
    log_probs = ops.log_softmax(logits, axis=-1)
    true_log_prob = ops.squeeze(
        ops.take_along_axis(log_probs, ops.expand_dims(y_true, -1), axis=-1), -1
    )
    high, low, entropy = smoothed_target(vocab_size, label_smoothing)
    if label_smoothing:
        sum_log_probs = ops.sum(log_probs, axis=-1)
        cross_entropy = -(high * true_log_prob + low * (sum_log_probs - true_log_prob))
        per_token = cross_entropy - entropy
    else:
        per_token = -true_log_prob
    return ops.where(ops.not_equal(y_true, pad_id), per_token, 0.0)


def smoothed_target(vocab_size, label_smoothing):
    """The smoothed target distribution q (paper section 5.4) as
    `(q on the reference token, q on each other token, entropy of q)`:
    `1 - eps`, `eps / (V - 1)` (so q sums to 1) and `-sum_v q_v log q_v`,
    the loss's minimum, subtracted so that the loss is KL(q || model).
    `vocab_size` may be a scalar tensor (shapes unknown at trace time)."""
    eps = label_smoothing
    if not eps:
        return 1.0, 0.0, 0.0
    low = eps / ops.cast(vocab_size - 1, "float32")
    return 1.0 - eps, low, -((1.0 - eps) * math.log(1.0 - eps) + eps * ops.log(low))


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
