"""The position-wise linear maps of sections 3.2 and 3.3 (`x W + b`), as
`keras.layers.Dense` on a 2-D view of the input.

Every projection in the model (W^Q, W^K, W^V, W^O, the two feed-forward
layers) maps the last axis of a `(batch, length, d)` tensor. Keras's `Dense`
multiplies such an input with `tensordot` (reshape, matmul, reshape), and on
TensorFlow the bias add then follows a reshape, so Grappler cannot fuse it
(and the ReLU) into the matmul. Multiplying `(batch * length, d)` lets it.
In float32 training where TensorFlow multiplies with Eigen,
`keras_transformer.dispatch.dense` may take a written-out gradient with
products in slices instead (`kernels/dense.py`). Outside training, in a
search traced under `dispatch.using_column_blocks`, a layer with column
blocks multiplies a few rows by them instead (`kernels/column_blocks.py`).
"""

import keras
from keras import ops

from keras_transformer import dispatch
from keras_transformer.ops.shapes import leading_axes, size


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` (same arguments, weights and results) that
    flattens the leading axes of inputs of rank > 2 around the matmul.

    Call: `(..., d_in)` -> `(..., units)`.
    """

    def call(self, inputs, training=None):
        if len(inputs.shape) <= 2:
            return self._call_2d(inputs, training)
        outputs = self._call_2d(ops.reshape(inputs, (-1, size(inputs, -1))), training)
        return ops.reshape(outputs, leading_axes(inputs, len(inputs.shape) - 1) + (self.units,))

    def _call_2d(self, inputs, training):
        return dispatch.dense(self, inputs, training, super().call)
