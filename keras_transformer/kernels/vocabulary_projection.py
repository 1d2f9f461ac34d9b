"""The tied pre-softmax projection `x E^T` (paper section 3.4) for float32
training on TensorFlow, in slices of the vocabulary (`eigen_slices.py`).

The forward product `x E^T` and the table's gradient `(x^T dl)^T` have rows
as long as the vocabulary, for which Eigen's contraction is slow when that
is a multiple of 2,048; both are computed in slices of at most 1,024 rows of
`E`. The input's gradient `dl E` does not suffer and stays one matmul.
`keras_transformer.dispatch.vocabulary_logits` decides when this is taken.

TensorFlow only.
"""


import tensorflow as tf

from keras_transformer.kernels import eigen_slices


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
