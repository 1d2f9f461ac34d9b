"""Column-block copies of a model's decoder weights, an export option
(`Translator(xla_column_blocks=n)`, `kt-export --xla-column-blocks`).
TensorFlow-only module.

The XLA search of an export traced inside
`keras_transformer.dispatch.using_column_blocks(copies(model, n))` takes
the decoder's products of few rows block by block
(`keras_transformer/kernels/column_blocks.py`, through `dispatch`): the
same translations to float32 rounding, lower latency for a few sentences on
CPU, and a SavedModel larger by these weights.
"""

import numpy as np
import tensorflow as tf

from keras_transformer.layers.dense import Dense


def check_count(blocks, name="blocks"):
    """ValueError naming `name` unless `blocks` is an int >= 1."""
    if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 1:
        raise ValueError(f"`{name}` must be an int >= 1, received {blocks!r}.")


def block_sizes(columns, blocks):
    """`blocks` sizes summing to `columns`, the first ones one larger
    where it does not divide (as `numpy.array_split`)."""
    check_count(blocks)
    if blocks > columns:
        raise ValueError(f"Cannot cut {columns} columns into {blocks} blocks.")
    return [len(part) for part in np.array_split(np.arange(columns), blocks)]


def split(array, blocks, axis):
    """`array` (NumPy) cut into `blocks` contiguous copies along `axis`."""
    array = np.asarray(array)
    sizes = block_sizes(array.shape[axis], blocks)
    return [np.ascontiguousarray(part)
            for part in np.split(array, np.cumsum(sizes)[:-1], axis=axis)]


def copies(model, blocks, name="xla_column_blocks"):
    """`{id(layer): blocks}` for `dispatch.using_column_blocks`: `blocks`
    column blocks of each decoder `Dense` (`[(kernel, bias or None), ...]`)
    and of the output projection (row blocks of the tied table, `[E_i,
    ...]`), as new non-trainable `tf.Variable`s named after the weight and
    the block; `{}` for `blocks == 1`. Layers under Keras's LoRA or
    quantization keep their own weights. `ValueError` naming `name` for a
    count that is not an int >= 1, or one above a layer's columns."""
    check_count(blocks, name)
    if blocks == 1:
        return {}

    def variables(arrays, weight_name):
        return [tf.Variable(a, trainable=False, name=f"{weight_name}_block{i}")
                for i, a in enumerate(arrays)]

    layers = [layer for layer in model.decoder._flatten_layers(include_self=False)
              if isinstance(layer, Dense)]
    if model.output_projection is not None:
        layers.append(model.output_projection)
    found = {}
    for layer in layers:
        if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
            continue
        kernels = variables(split(layer.kernel.numpy(), blocks, axis=1), layer.kernel.path)
        biases = ([None] * blocks if layer.bias is None else
                  variables(split(layer.bias.numpy(), blocks, axis=0), layer.bias.path))
        found[id(layer)] = list(zip(kernels, biases))
    if model.output_projection is None:
        table = model.target_embedding.token_embedding
        found[id(table)] = variables(split(table.embeddings.numpy(), blocks, axis=0),
                                     table.embeddings.path)
    return found
