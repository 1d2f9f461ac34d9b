"""The label-smoothed cross-entropy (paper section 5.4) on TensorFlow as
two XLA clusters, forward and backward, with the gradient written out.

`ops/label_smoothing.py` defines the loss in `keras.ops`; this is how a
TensorFlow training step runs it. The loss is elementwise work and row
reductions over `(tokens, vocabulary)` float32 logits, which the graph
executor runs as several passes and XLA as one or two; the matmul that
produces the logits stays outside (XLA:CPU's matmuls are slower than
TensorFlow's oneDNN kernels).

Differentiating the `keras.ops` loss compiled as one XLA function would make
the forward cluster return a second `(tokens, vocabulary)` tensor (the
log-probabilities) for the backward one. Here the forward pass keeps only
each row's log-sum-exp, and the backward pass is the closed form: for a
target distribution `q` (`1 - eps` on the reference token, `eps / (V - 1)`
elsewhere, summing to 1), the gradient of `-sum_v q_v log softmax(x)_v` is
`softmax(x) - q`.

TensorFlow only, and only training runs it: exported serving signatures
stay XLA-free for a stock TF Serving binary.
"""


import functools

import tensorflow as tf

from keras_transformer.ops.label_smoothing import smoothed_target

_xla = functools.partial(tf.function, jit_compile=True, autograph=False,
                         reduce_retracing=True)


@_xla
def _forward(y_true, logits, label_smoothing, pad_id):
    """`(per-token loss (batch, tgt_len), log-sum-exp (batch, tgt_len))`."""
    vocab_size = tf.shape(logits)[-1]
    high, low, entropy = smoothed_target(vocab_size, label_smoothing)
    row_max = tf.reduce_max(logits, axis=-1, keepdims=True)
    log_sum_exp = (tf.math.log(tf.reduce_sum(tf.exp(logits - row_max), axis=-1))
                   + row_max[..., 0])
    true_log_prob = tf.gather(logits, y_true, batch_dims=len(y_true.shape)) - log_sum_exp
    per_token = -high * true_log_prob
    if label_smoothing:
        # sum_v log p_v = sum_v x_v - V * logsumexp(x), without the
        # log-probabilities themselves.
        sum_log_probs = (tf.reduce_sum(logits, axis=-1)
                         - tf.cast(vocab_size, tf.float32) * log_sum_exp)
        per_token -= low * (sum_log_probs - true_log_prob)
    return tf.where(tf.not_equal(y_true, pad_id), per_token - entropy, 0.0), log_sum_exp


@_xla
def _backward(upstream, y_true, logits, log_sum_exp, label_smoothing, pad_id):
    """`upstream * (softmax(logits) - q)`, 0 at padding: `(batch, tgt_len, V)`."""
    vocab_size = tf.shape(logits)[-1]
    high, low, _ = smoothed_target(vocab_size, label_smoothing)
    probs = tf.exp(logits - log_sum_exp[..., None])
    target = tf.where(tf.equal(tf.range(vocab_size), y_true[..., None]), high, low)
    upstream = tf.where(tf.not_equal(y_true, pad_id), upstream, 0.0)
    return upstream[..., None] * (probs - target)


def label_smoothed_cross_entropy(y_true, y_pred, label_smoothing, pad_id):
    """Per-token KL(smoothed target || model), as
    `ops.label_smoothing.label_smoothed_cross_entropy`, with a written-out
    gradient.

    Args:
        y_true: `(batch, tgt_len)` int ids.
        y_pred: `(batch, tgt_len, V)` logits, any float dtype (cast to
            float32 outside XLA: for bfloat16, TensorFlow's cast is faster
            than XLA:CPU's convert).
        label_smoothing: eps_ls, a Python float.
        pad_id: a Python int; ids equal to it get 0 and no gradient.

    Returns: `(batch, tgt_len)` float32. Gradient: for `y_pred` only.
    """
    y_true = tf.cast(y_true, tf.int32)
    label_smoothing = float(label_smoothing)
    pad_id = int(pad_id)

    @tf.custom_gradient
    def fused(logits):
        logits32 = tf.cast(logits, tf.float32)
        per_token, log_sum_exp = _forward(y_true, logits32, label_smoothing, pad_id)

        def grad(upstream):
            dlogits = _backward(tf.cast(upstream, tf.float32), y_true, logits32, log_sum_exp,
                                label_smoothing, pad_id)
            return tf.cast(dlogits, logits.dtype)

        return per_token, grad

    return fused(y_pred)
