"""TensorFlow-only fast paths: each computes what a portable function of
`keras_transformer/ops/` (or a Keras layer or optimizer) computes, in a form
TensorFlow runs faster on some hardware.

Nothing but `keras_transformer/dispatch.py` imports these modules: it
decides when each is taken (backend, matmul kernels, precision, training)
and holds the switches that turn them off. docs/performance.md lists each
path's measured gain and the command that measured it. `column_blocks` is
the one not behind a switch: the decoder's products in column blocks, an
export option taken only in the exported XLA search (see `dispatch`).
"""
