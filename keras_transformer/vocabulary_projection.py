"""The tied pre-softmax projection `x E^T` (paper section 3.4) in float32
training on TensorFlow where it multiplies with Eigen, computed in slices
of the vocabulary (`eigen_slices.py`).

Eigen's contraction runs at about half speed when the result's rows are a
multiple of 2,048 floats long, as the logits' rows are for a vocabulary of
8,192 or 32,768 tokens. The forward product `x E^T` is computed in slices
of at most 1,024 rows of `E`; the gradient for `E`, `(x^T dl)^T`, reads the
logits' gradient `dl` with the same row length and is computed in the same
column slices; the gradient for `x`, `dl E`, does not suffer and stays one
matmul. The bench training step (vocabulary 8,192) was 1.10x faster on a
2-core AMD EPYC (Zen 3, AVX2) host, with bit-identical losses and weights
(benchmarks/README.md, "The same host, a fifth session").

TensorFlow only; `layers/embedding.py` decides when to call it
(`eigen_slices.pays(vocab_size)`).
"""

import tensorflow as tf

from keras_transformer import eigen_slices


def logits(x, table, slice_size=eigen_slices.SLICE):
    """`x table^T`, in slices of `table`'s rows; gradient written out.

    Args:
        x: `(rows, d_model)`.
        table: `(vocab, d_model)`, the embedding matrix E (same dtype as `x`).
        slice_size: the longest slice of the vocabulary.

    Returns: `(rows, vocab)`, the same values as `tf.matmul(x, table,
    transpose_b=True)`. Gradients for `x` (`dl E`) and `table`
    (`(x^T dl)^T`, in the same slices).
    """
    x, table = tf.convert_to_tensor(x), tf.convert_to_tensor(table)

    @tf.custom_gradient
    def project(x, table):
        result = eigen_slices.matmul(x, table, transpose_b=True, slice_size=slice_size)

        def grad(upstream):
            dx = tf.matmul(upstream, table)
            dtable = eigen_slices.matmul(x, upstream, transpose_a=True, slice_size=slice_size)
            return dx, tf.transpose(dtable)

        return result, grad

    return project(x, table)
