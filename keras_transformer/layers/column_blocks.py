"""The decoder's products in column blocks: `x W` as `[x W_1, ..., x W_n]`.

A decoding step for one sentence multiplies a few rows (the beams) by every
weight of the decoder and by the output table. Given copies of those
weights cut into column blocks, each product becomes `n` smaller
independent ones, which XLA:CPU may run side by side on its threads
(docs/performance.md has the measurements). The math is the same (each
output column is the same dot product), so results agree to float32
rounding.

The copies are made once from trained weights (`split`) and passed to the
layers through `using`, while a search is traced: `Dense`
(`layers/dense.py`) and `TokenEmbedding.logits` (`layers/embedding.py`)
outside training look their layer up (`product`) and multiply by its blocks
when it has some and the product has at most `MAX_ROWS` rows; larger
products use the layer's own weights. `keras.ops` only;
`export.Translator(xla_column_blocks=n)` owns the copies.
"""

import contextlib
import threading

import numpy as np
from keras import ops

_SCOPES = threading.local()  # each thread traces with its own `using`s
# Up to 8 sentences at beam 4; at the 128 rows of 32 sentences the blocks
# cost throughput (docs/performance.md).
MAX_ROWS = 32


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


def _active():
    if not hasattr(_SCOPES, "stack"):
        _SCOPES.stack = []
    return _SCOPES.stack


@contextlib.contextmanager
def using(blocks_by_layer):
    """While active, `product` finds a layer's blocks in `blocks_by_layer`
    (a mapping from `id` of a layer to its blocks). Meant around the
    tracing of a search: what is traced keeps the blocks."""
    stack = _active()
    stack.append(blocks_by_layer)
    try:
        yield
    finally:
        stack.pop()


def product(layer, rows, blocked, whole):
    """`blocked(blocks)` if the innermost active `using` has blocks for
    `layer` and `rows` `(n, d)` has at most `MAX_ROWS` rows, else `whole()`.

    With `n` unknown when traced (a SavedModel signature's batch), a
    conditional on it chooses; XLA compiles each batch shape on its own and
    keeps only the branch that shape takes.
    """
    stack = _active()
    blocks = stack[-1].get(id(layer)) if stack else None
    if blocks is None:
        return whole()
    n = rows.shape[0]
    if n is not None:
        return blocked(blocks) if n <= MAX_ROWS else whole()
    return ops.cond(ops.shape(rows)[0] <= MAX_ROWS, lambda: blocked(blocks), whole)


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
    `(E_i x^T)^T` per block (`TokenEmbedding.logits`' form outside
    training); `rows` `(rows, d)` -> `(rows, sum v_i)`."""
    parts = [ops.matmul(ops.cast(table, rows.dtype), ops.transpose(rows)) for table in blocks]
    return ops.transpose(ops.concatenate(parts, axis=0))
