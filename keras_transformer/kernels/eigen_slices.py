"""Float32 matrix products in slices of their result's columns.

Eigen's tensor contraction, which TensorFlow multiplies float32 matrices
with on CPUs where it does not enable oneDNN, runs at up to half speed when
the result's rows are a multiple of 2,048 floats long. Slices of at most
1,024 columns, multiplied one by one and joined, avoid that; each column is
the same dot product, so the values are those of the whole product up to the
order the kernel sums in. `keras_transformer.dispatch.slices_pay` decides
where slices are taken (Eigen, such a width, float32 training);
`kernels/dense.py` and `kernels/vocabulary_projection.py` use them.

TensorFlow only.
"""

import tensorflow as tf

# Slices at most this many columns wide.
SLICE = 1024
# Eigen's contraction is slow for results whose rows are a multiple of this.
SLOW_WIDTH_MULTIPLE = 2048


def slice_sizes(width, slice_size=SLICE):
    """Sizes of the fewest near-equal slices of at most `slice_size` columns."""
    count = -(-width // slice_size)
    return [width // count + (1 if i < width % count else 0) for i in range(count)]


def matmul(a, b, transpose_a=False, transpose_b=False, slice_size=SLICE):
    """`tf.matmul(a, b, transpose_a, transpose_b)` for 2-D `a` and `b`, as
    the join of the products with slices of `b` that give at most
    `slice_size` columns of the result each.

    Returns: `(rows, width)`, `width` being `b`'s rows if `transpose_b`
    else its columns.
    """
    axis = 0 if transpose_b else 1
    pieces = tf.split(b, slice_sizes(b.shape[axis], slice_size), axis=axis)
    return tf.concat([tf.matmul(a, piece, transpose_a=transpose_a, transpose_b=transpose_b)
                      for piece in pieces], axis=1)
