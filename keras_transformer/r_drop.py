"""R-Drop (Liang et al., NeurIPS 2021, "R-Drop: Regularized Dropout for
Neural Networks"): each training batch goes through the model twice, with
independent dropout masks, and the loss adds the symmetric KL divergence
between the two predicted distributions to the mean of the two
cross-entropies, so the sub-models dropout samples agree.

    loss = (CE(p1) + CE(p2)) / 2 + alpha * (KL(p1 || p2) + KL(p2 || p1)) / 2

per real target token, normalised as the cross-entropy is (tokens of the
global batch). `Transformer.compute_loss` applies it when
`TransformerConfig.r_drop` (alpha) is above 0 (`kt-train --r-drop ALPHA`).
A step then costs about two forward and backward passes.
"""

from keras import ops

__all__ = ["symmetric_kl", "r_drop_term"]


def symmetric_kl(logits_a, logits_b):
    """`(KL(p_a || p_b) + KL(p_b || p_a)) / 2` per position, `(...,)`
    float32, for logits `(..., vocab)` (any float dtype; computed in
    float32): `sum((p_a - p_b) * (log p_a - log p_b)) / 2` over the
    vocabulary. Zero when the distributions are equal, never negative.

    Example:

    ```python
    import numpy as np
    from keras_transformer.r_drop import symmetric_kl

    a = np.array([[2.0, 0.0, -1.0]], "float32")
    b = np.array([[0.0, 1.0, 0.0]], "float32")
    kl = np.asarray(symmetric_kl(a, b))
    assert kl.shape == (1,) and kl[0] > 0
    assert float(np.asarray(symmetric_kl(a, a))[0]) == 0.0
    ```
    """
    log_a = ops.log_softmax(ops.cast(logits_a, "float32"), axis=-1)
    log_b = ops.log_softmax(ops.cast(logits_b, "float32"), axis=-1)
    return 0.5 * ops.sum((ops.exp(log_a) - ops.exp(log_b)) * (log_a - log_b), axis=-1)


def r_drop_term(logits_a, logits_b, weights, total_tokens):
    """`sum(symmetric_kl * weights) / total_tokens`: the R-Drop term of a
    replica's batch, `weights` `(batch, tgt_len)` 1 at real target tokens
    (`losses.real_token_weights`), `total_tokens` their number over the
    global batch (so the replicas' terms sum to the global mean).

    Example:

    ```python
    import numpy as np
    from keras_transformer.r_drop import r_drop_term

    a, b = np.zeros((1, 2, 5), "float32"), np.ones((1, 2, 5), "float32")
    weights = np.array([[1.0, 0.0]], "float32")  # one real token, one pad
    assert float(r_drop_term(a, b, weights, 1.0)) == 0.0  # equal distributions
    ```
    """
    kl = symmetric_kl(logits_a, logits_b)
    return ops.divide_no_nan(ops.sum(kl * weights), ops.cast(total_tokens, "float32"))
