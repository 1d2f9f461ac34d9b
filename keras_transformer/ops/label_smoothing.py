"""Label smoothing (paper section 5.4): the smoothed target distribution and
the per-token loss against it, in `keras.ops`."""

import math

from keras import ops


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
