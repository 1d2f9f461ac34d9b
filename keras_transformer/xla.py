"""XLA for the parts of a TensorFlow training step where it pays, and only
those.

On CPU, XLA-compiling the whole Keras training step made it slower (0.68x
in mixed bfloat16 on the bench configuration, with every XLA:CPU oneDNN and
XNNPACK option tried): its matmuls are slower than TensorFlow's oneDNN
kernels, which are most of the step. Elementwise work is the opposite: the
label-smoothed loss over `(tokens, vocabulary)` logits is several passes
over a tensor of 67 MB in the graph executor, and one or two as an XLA
fusion (forward and backward 23.9 -> 13.9 ms, bench shapes). So the loss
runs as its own XLA cluster inside the uncompiled step, and the matmul that
produces the logits stays outside it.

Only training code goes through here: exported serving signatures must stay
XLA-free for a stock TF Serving binary (`tests/test_export.py` checks that).
On other backends (JAX compiles the whole step) functions pass through.
"""

import keras


def compile_on_tensorflow(fn):
    """`fn` (tensors in, tensors out, no Python control flow on tensor
    values) compiled with XLA when Keras runs on TensorFlow; `fn` itself on
    other backends."""
    if keras.backend.backend() != "tensorflow":
        return fn
    import tensorflow as tf

    return tf.function(fn, jit_compile=True, autograph=False, reduce_retracing=True)
