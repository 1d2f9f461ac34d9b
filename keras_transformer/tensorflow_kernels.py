"""Which kernels TensorFlow multiplies float32 matrices with in this process:
oneDNN's, Eigen's or a GPU's.

TensorFlow enables oneDNN on CPU by default only on x86 CPUs with
AVX512_VNNI, AVX512_BF16, AMX and the like (or where `TF_ENABLE_ONEDNN_OPTS=1`
is set); everywhere else (e.g. AMD Zen 3, Intel before Cascade Lake) its
CPU matmuls are Eigen's tensor contraction. The two are fast at different
things: on a 2-core AMD EPYC (Zen 3, AVX2) host Eigen's matmul is ~2x slower
on results whose rows are a multiple of 2,048 floats (`eigen_slices.py`)
and its batched matmul of attention's small heads ~4x slower than oneDNN's
(`compiled_attention.py`), while oneDNN does neither and was slower in the
ways around them. Those paths ask `multiplies_with_eigen()`.

TensorFlow only.
"""

import functools

import tensorflow as tf


@functools.cache
def tensorflow_uses_onednn():
    """Whether this process's TensorFlow multiplies with oneDNN (its
    `TF_ENABLE_ONEDNN_OPTS` setting, or its default for this CPU). Where
    the private query is missing, assumes it does, which keeps TensorFlow's
    own ops."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return True
    return bool(_pywrap_util_port.IsMklEnabled())


def multiplies_with_eigen():
    """Whether float32 products run on Eigen's kernels here: TensorFlow
    without oneDNN, and no GPU to place them on."""
    return not tensorflow_uses_onednn() and not tf.config.list_logical_devices("GPU")
