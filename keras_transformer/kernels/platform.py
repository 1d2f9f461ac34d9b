"""What TensorFlow multiplies float32 matrices with in this process:
oneDNN's kernels, Eigen's, a GPU's, or XLA's inside a compiled function.

TensorFlow enables oneDNN on CPU by default only on x86 CPUs with
AVX512_VNNI, AVX512_BF16, AMX and the like (or where
`TF_ENABLE_ONEDNN_OPTS=1` is set); elsewhere (e.g. AMD Zen 3, Intel before
Cascade Lake) its CPU matmuls are Eigen's tensor contraction. The two are
fast at different shapes, so some fast paths are taken under one only
(`keras_transformer.dispatch.multiplies_with_eigen`).

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


def has_gpu():
    """Whether TensorFlow places ops on a GPU here."""
    return bool(tf.config.list_logical_devices("GPU"))


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
