"""The position-wise linear maps of sections 3.2 and 3.3 (`x W + b`), as
`keras.layers.Dense` on a 2-D view of the input.

Every projection in the model (W^Q, W^K, W^V, W^O, the two feed-forward
layers) maps the last axis of a `(batch, length, d)` tensor. Keras's `Dense`
multiplies such an input with `tensordot` (reshape, matmul, reshape), and on
TensorFlow the bias add then follows a reshape, so Grappler cannot fuse it
(and the ReLU) into oneDNN's matmul. Multiplying `(batch * length, d)`
lets it: the bench training step was 2-4% faster, measured in one process
against `keras.layers.Dense`.

In float32 training on TensorFlow, layers at least as wide as their input
(the attention projections, the feed-forward network's inner layer, an
untied output projection) run through `keras_transformer/dense_gradient.py`
instead: the same forward ops, with a gradient that multiplies by a
transposed copy of the kernel, which oneDNN runs faster here (the bench
step 1.02-1.03x). Where TensorFlow multiplies with Eigen, so do layers with
2,048 or 4,096 inputs (the feed-forward network's outer layer in `base` and
`big`): their input gradient's product is computed in slices
(`eigen_slices.py`).
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` (same arguments, weights and results) that
    flattens the leading axes of inputs of rank > 2 around the matmul.

    Call: `(..., d_in)` -> `(..., units)`.
    """

    def call(self, inputs, training=None):
        if len(inputs.shape) <= 2:
            return self._call_2d(inputs, training)
        shape = ops.shape(inputs)
        outputs = self._call_2d(ops.reshape(inputs, (-1, shape[-1])), training)
        return ops.reshape(outputs, tuple(shape[:-1]) + (self.units,))

    def _call_2d(self, inputs, training):
        if not (training and self._written_out_gradient(inputs)):
            return super().call(inputs, training=training)
        from keras_transformer import dense_gradient  # TensorFlow only

        return dense_gradient.dense(inputs, self.kernel, self.bias,
                                    relu=self.activation is keras.activations.relu)

    def _written_out_gradient(self, inputs):
        """Whether training takes `dense_gradient.dense`: TensorFlow, float32,
        ReLU or no activation, none of Keras's LoRA or quantized variants,
        and a kernel at least as wide as tall, or one with a side whose
        products `eigen_slices.py` computes in slices here."""
        if not (keras.backend.backend() == "tensorflow"
                and self.compute_dtype == "float32"
                and keras.backend.standardize_dtype(inputs.dtype) == "float32"
                and self.activation in (keras.activations.relu, keras.activations.linear)
                and not getattr(self, "lora_enabled", False)
                and getattr(self, "quantization_mode", None) is None):
            return False
        d_in = self.kernel.shape[0]
        if self.units >= d_in:
            return True
        from keras_transformer import eigen_slices  # TensorFlow only

        return eigen_slices.pays(d_in) or eigen_slices.pays(self.units)
