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

Inside a function XLA compiles (`model.compile(jit_compile=True)`), XLA
emits the products itself: it had no such slowdown there (`x (2,048 x 256)
E^T` at 107 GFLOP/s for 8,000 rows and 109 for 8,192, where TensorFlow's
kernel ran at 96 and 65), and attention compiled as a function of its own
*inside* an XLA-compiled training step made that step ~60x slower (40-60 s
against 0.75 s for the bench step). So `multiplies_with_eigen()` is False
while XLA compiles (`inside_xla_compilation()`).

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


def inside_xla_compilation():
    """Whether the ops being built now will be compiled by XLA: traced in a
    `tf.function(jit_compile=True)`, or in a function it calls. Asks the
    private query `tf.function` itself uses; where it is missing, answers
    False."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def multiplies_with_eigen():
    """Whether float32 products built here run on Eigen's kernels in
    TensorFlow's executor: TensorFlow without oneDNN, no GPU to place them
    on, and not inside a function XLA compiles."""
    return (not tensorflow_uses_onednn() and not tf.config.list_logical_devices("GPU")
            and not inside_xla_compilation())
