"""float16 weights for a float32 LiteRT file: each large float32 constant
that fits float16's range is stored as float16 and widened back to float32
by a DEQUANTIZE op when the file is loaded; the arithmetic stays float32.

This is what the converter's float16 mode
(`target_spec.supported_types = [tf.float16]`) does, less one thing: the
converter narrows every float constant, scalars included, and clamps those
beyond float16's range (the beam search's -1e9 sentinel becomes -65504, in
the main graph but not in the search loop's body, so the two disagree on
what "impossible" is). Here only constants of at least `MIN_ELEMENTS`
values whose every value is finite in float16 are narrowed: the weights;
the search's scalars stay exact.

The file is read and written with TensorFlow's flatbuffer tools
(`tensorflow.lite.tools.flatbuffer_utils` and the LiteRT schema's object
API), not by hand.

TensorFlow-only module.
"""

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

# The converter's own threshold for weight quantization (dynamic-range).
MIN_ELEMENTS = 1024
FLOAT16_MAX = float(np.finfo(np.float16).max)
# DEQUANTIZE's version with a float16 input.
DEQUANTIZE_VERSION = 3


def float16_weights(tflite_bytes, min_elements=MIN_ELEMENTS):
    """`tflite_bytes` (a float32 LiteRT file) with its weights stored as
    float16.

    Each float32 constant tensor of at least `min_elements` values, all
    within +-65504, becomes the output of a DEQUANTIZE op (inserted first
    in its subgraph) whose input is a new float16 constant; a buffer shared
    by several tensors is narrowed once. Smaller constants and those with a
    value beyond float16's range keep their float32 bytes. Signatures and
    tensor indices are unchanged.

    Args:
        tflite_bytes: the `.tflite` file's bytes.
        min_elements: the smallest constant narrowed.

    Returns: the new file's bytes.

    Example:
    >>> import numpy as np, tensorflow as tf
    >>> from keras_transformer.export.litert_float16 import float16_weights
    >>> weights = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    >>> @tf.function(input_signature=[tf.TensorSpec([1, 64], tf.float32)])
    ... def project(x):
    ...     return tf.maximum(tf.matmul(x, weights), -1e9)
    >>> converter = tf.lite.TFLiteConverter.from_concrete_functions(
    ...     [project.get_concrete_function()])
    >>> float32 = converter.convert()
    >>> float16 = float16_weights(float32)
    >>> len(float16) < 0.6 * len(float32)
    True
    >>> interpreter = tf.lite.Interpreter(model_content=float16)
    >>> interpreter.allocate_tensors()
    >>> x = np.ones((1, 64), np.float32)
    >>> interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    >>> interpreter.invoke()
    >>> y = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    >>> bool(np.allclose(y, x @ weights.astype(np.float16).astype(np.float32), atol=1e-4))
    True
    """
    model = flatbuffer_utils.read_model_from_bytearray(bytearray(tflite_bytes))
    dequantize = _dequantize_opcode(model)
    narrowed = {}  # float32 buffer index -> float16 buffer index
    for subgraph in model.subgraphs:
        for index in range(len(subgraph.tensors)):
            tensor = subgraph.tensors[index]
            values = _float32_constant(model, tensor)
            if values is None or values.size < min_elements \
                    or not np.all(np.abs(values) <= FLOAT16_MAX):
                continue
            if tensor.buffer not in narrowed:
                buffer = schema.BufferT()
                buffer.data = np.frombuffer(values.astype("<f2").tobytes(), np.uint8)
                model.buffers.append(buffer)
                narrowed[tensor.buffer] = len(model.buffers) - 1
            half = schema.TensorT()
            half.shape, half.shapeSignature = tensor.shape, tensor.shapeSignature
            half.type, half.buffer = schema.TensorType.FLOAT16, narrowed[tensor.buffer]
            half.name = (tensor.name or b"") + b"/float16"
            subgraph.tensors.append(half)
            widen = schema.OperatorT()
            widen.opcodeIndex = dequantize
            widen.inputs, widen.outputs = [len(subgraph.tensors) - 1], [index]
            subgraph.operators.insert(0, widen)
            tensor.buffer = 0  # buffer 0 is the empty one: computed, not constant
    still_used = {tensor.buffer for subgraph in model.subgraphs for tensor in subgraph.tensors}
    for index in narrowed:
        if index not in still_used:
            model.buffers[index].data = None
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _float32_constant(model, tensor):
    """A float32 constant tensor's values (flat), else None."""
    data = model.buffers[tensor.buffer].data
    if tensor.type != schema.TensorType.FLOAT32 or data is None or len(data) == 0:
        return None
    return np.frombuffer(bytes(data), "<f4")


def _dequantize_opcode(model):
    """The index of DEQUANTIZE in `model.operatorCodes`, added (or its
    version raised to take float16) as needed."""
    for index, code in enumerate(model.operatorCodes):
        if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE:
            code.version = max(code.version, DEQUANTIZE_VERSION)
            return index
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.DEQUANTIZE
    code.version = DEQUANTIZE_VERSION
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1
