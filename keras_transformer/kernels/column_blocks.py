"""The decoder's products in column blocks: `x W` as `[x W_1, ..., x W_n]`.

A decoding step for one sentence multiplies a few rows (the beams) by every
weight of the decoder and by the output table. Given copies of those
weights cut into column blocks, each product becomes `n` smaller
independent ones, which XLA:CPU may run side by side on its threads
(docs/performance.md has the measurements). The math is the same (each
output column is the same dot product), so results agree to float32
rounding.

`keras.ops` only. Reached through `keras_transformer.dispatch` (`dense`,
`decoding_logits`), which takes these products inside
`dispatch.using_column_blocks`, for products of few rows, outside training;
the blocks are copies that the export makes
(`keras_transformer/export/column_blocks.py`).
"""

from keras import ops


def dense(x, blocks, activation):
    """`activation(x W + b)` from `blocks` `[(W_i (d_in, c_i), b_i (c_i,)
    or None), ...]`, `x` `(rows, d_in)` -> `(rows, sum c_i)`."""
    outputs = []
    for kernel, bias in blocks:
        y = ops.matmul(x, ops.cast(kernel, x.dtype))
        if bias is not None:
            y = y + ops.cast(bias, x.dtype)
        outputs.append(y)
    return activation(ops.concatenate(outputs, axis=-1))


def table_logits(rows, blocks):
    """`x E^T` from row blocks of the table `E` `[E_i (v_i, d), ...]`, as
    `(E_i x^T)^T` per block (`dispatch.decoding_logits`' form); `rows`
    `(rows, d)` -> `(rows, sum v_i)`."""
    parts = [ops.matmul(ops.cast(table, rows.dtype), ops.transpose(rows)) for table in blocks]
    return ops.transpose(ops.concatenate(parts, axis=0))
