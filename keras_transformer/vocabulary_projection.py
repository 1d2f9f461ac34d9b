"""The tied pre-softmax projection `x E^T` (paper section 3.4) in float32
training on TensorFlow without oneDNN, computed in slices of the vocabulary.

TensorFlow multiplies float32 matrices on CPU with oneDNN where it enables
oneDNN (by default only on x86 CPUs with AVX512_VNNI, AVX512_BF16, AMX and
the like) and with Eigen's tensor contraction everywhere else, e.g. on AMD
Zen 3 or on Intel CPUs before Cascade Lake. Eigen's contraction runs at
about half speed when the result's rows are a multiple of 2,048 floats
long. Measured on a 2-core AMD EPYC (Zen 3, AVX2) host, `x (2,048 x 256)`
times `E^T` for a vocabulary of V tokens (benchmarks/README.md, "The same
host, a fifth session"):

    V        2,048  3,000  4,096  8,000  8,192  12,288  20,000  24,576  32,768
    GFLOP/s    103    176     91    174     90      90     171      89      65

Slices of at most 1,024 rows of `E`, multiplied one by one and joined,
ran at 154-164 GFLOP/s for each such V from 4,096 up (127 at 2,048), but
cost 2-13% where V is not a multiple of 2,048, so they are used only where
it is. The gradient for `E`, `(x^T dl)^T`, reads the logits' gradient `dl`
with the same row length and is computed in the same column slices; the
gradient for `x`, `dl E`, does not suffer and stays one matmul. The bench
training step (vocabulary 8,192) was 1.10x faster there, with bit-identical
losses and weights. With oneDNN enabled (`TF_ENABLE_ONEDNN_OPTS=1`) on the
same host whole matmuls are fast and the slices measured 0.98x, so they are
not used under oneDNN (TensorFlow's default on the AVX-512 host where the
targets were set).

TensorFlow only; `layers/embedding.py` decides when to call it.
"""

import functools

import tensorflow as tf

# Slices of the vocabulary at most this many tokens long.
SLICE = 1024
# Eigen's contraction is slow for results whose rows are a multiple of this.
SLOW_ROW_MULTIPLE = 2048


@functools.cache
def tensorflow_uses_onednn():
    """Whether this process's TensorFlow multiplies with oneDNN (its
    `TF_ENABLE_ONEDNN_OPTS` setting, or its default for this CPU). Where
    the private query is missing, assumes it does, which keeps whole
    matmuls."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return True
    return bool(_pywrap_util_port.IsMklEnabled())


def pays(vocab_size):
    """Whether `logits` in slices is faster than one matmul here."""
    return vocab_size % SLOW_ROW_MULTIPLE == 0 and not tensorflow_uses_onednn()


def slice_sizes(vocab_size, slice_size=SLICE):
    """Sizes of the fewest near-equal slices of at most `slice_size` tokens."""
    count = -(-vocab_size // slice_size)
    return [vocab_size // count + (1 if i < vocab_size % count else 0) for i in range(count)]


def logits(x, table, slice_size=SLICE):
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
    sizes = slice_sizes(table.shape[0], slice_size)

    @tf.custom_gradient
    def project(x, table):
        pieces = [tf.matmul(x, rows, transpose_b=True) for rows in tf.split(table, sizes, axis=0)]
        result = tf.concat(pieces, axis=1)

        def grad(upstream):
            dx = tf.matmul(upstream, table)
            columns = tf.split(upstream, sizes, axis=1)
            dtable = tf.concat([tf.matmul(x, c, transpose_a=True) for c in columns], axis=1)
            return dx, tf.transpose(dtable)

        return result, grad

    return project(x, table)
