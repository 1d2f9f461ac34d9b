"""Float32 matrix products in slices of their result's columns, where
TensorFlow multiplies with Eigen and Eigen is slow for the whole product.

TensorFlow multiplies float32 matrices on CPU with oneDNN where it enables
oneDNN (by default only on x86 CPUs with AVX512_VNNI, AVX512_BF16, AMX and
the like) and with Eigen's tensor contraction everywhere else, e.g. on AMD
Zen 3 or on Intel CPUs before Cascade Lake. Eigen's contraction runs at up
to half speed when the result's rows are a multiple of 2,048 floats long.
Measured on a 2-core AMD EPYC (Zen 3, AVX2) host (benchmarks/README.md,
"The same host, a fifth session" and "a sixth session"), GFLOP/s of
`x (2,048 x 256) E^T` for a table `E` of V rows:

    V        2,048  3,000  4,096  8,000  8,192  12,288  20,000  24,576  32,768
    GFLOP/s    103    176     91    174     90      90     171      89      65

and of the feed-forward network's products for 2,048 rows, `d_model` d and
inner width f (`W1`: `(d, f)`, `W2`: `(f, d)`; control width in brackets):

    d x f          x W1       x^T dy1     dy2 W2^T
    512 x 2,048    117 (143)  131 (141)   123 (135)    (control f = 2,000)
    1,024 x 4,096   94 (189)   92 (174)    87 (162)    (control f = 4,000)

Slices of at most 1,024 columns, multiplied one by one and joined, ran at
154-164 GFLOP/s for the vocabularies from 4,096 up (127 at 2,048) and at
139-163 for the feed-forward products, but cost 2-13% where the width is not
a multiple of 2,048, so they are taken only where it is. Products whose
*inner* dimension is such a multiple (`dy1 W1^T`, `h W2`, `h^T dy2`) were
not slow, or (the last) slower in slices, and stay whole.

Under oneDNN (`TF_ENABLE_ONEDNN_OPTS=1` on the same host) whole products
are fast and the vocabulary slices measured 0.98x; on a GPU the products
are cuBLAS's; inside a function XLA compiles they are XLA's, which showed no
such slowdown. So slices are taken only where none applies
(`tensorflow_kernels.multiplies_with_eigen()`).

TensorFlow only; `vocabulary_projection.py` and `dense_gradient.py` call it.
"""

import tensorflow as tf

from keras_transformer import tensorflow_kernels

# Slices at most this many columns wide.
SLICE = 1024
# Eigen's contraction is slow for results whose rows are a multiple of this.
SLOW_WIDTH_MULTIPLE = 2048


def pays(width):
    """Whether a product whose result has `width` columns is faster in
    slices here."""
    return width % SLOW_WIDTH_MULTIPLE == 0 and tensorflow_kernels.multiplies_with_eigen()


def slice_sizes(width, slice_size=SLICE):
    """Sizes of the fewest near-equal slices of at most `slice_size` columns."""
    count = -(-width // slice_size)
    return [width // count + (1 if i < width % count else 0) for i in range(count)]


def matmul(a, b, transpose_a=False, transpose_b=False, slice_size=SLICE):
    """`tf.matmul(a, b, transpose_a, transpose_b)` for 2-D `a` and `b`, as
    the join of the products with slices of `b` that give at most
    `slice_size` columns of the result each. Same values: each column is
    the same dot product.

    Returns: `(rows, width)`, `width` being `b`'s rows if `transpose_b`
    else its columns.
    """
    axis = 0 if transpose_b else 1
    pieces = tf.split(b, slice_sizes(b.shape[axis], slice_size), axis=axis)
    return tf.concat([tf.matmul(a, piece, transpose_a=transpose_a, transpose_b=transpose_b)
                      for piece in pieces], axis=1)
