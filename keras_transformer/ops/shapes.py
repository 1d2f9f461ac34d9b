"""Axis sizes and reshape targets with as little shape arithmetic as the
static shape allows.

`keras.ops.shape` on TensorFlow slices every dynamic axis out of a new
`Shape` op, used or not, and a reshape to `(batch, length, ...)` built from
it adds a `Pack`. A traced search carries several of these per projection
and per decoding step, and each is traced, saved and loaded again with every
export (docs/performance.md#graph-size). `size` reads an axis from the
static shape where it is known; `leading_axes` gives a reshape target with
static sizes and `-1` for a single unknown one. On backends with static
shapes (JAX) both are the static shape.
"""

from keras import ops


def leading_axes(x, n):
    """A reshape target for the first `n` axes of `x`, to be followed by
    static sizes: a tuple of `n` entries, each a Python int where `x`'s
    static shape knows the size, `-1` where exactly one is unknown, and
    scalar tensors (one `ops.shape` call) where more than one is.

    Example:

    ```python
    from keras import ops
    from keras_transformer.ops.shapes import leading_axes

    x = ops.ones((2, 3, 8))
    y = ops.reshape(x, leading_axes(x, 2) + (2, 4))
    assert tuple(y.shape) == (2, 3, 2, 4)
    ```
    """
    static = tuple(x.shape[:n])
    unknown = static.count(None)
    if unknown == 0:
        return static
    if unknown == 1:
        return tuple(-1 if axis_size is None else axis_size for axis_size in static)
    return tuple(ops.shape(x)[:n])


def size(x, axis):
    """The size of `x` along `axis`: a Python int where the static shape
    knows it, otherwise a scalar int32 tensor.

    Example:

    ```python
    from keras import ops
    from keras_transformer.ops.shapes import size

    assert size(ops.ones((2, 3, 8)), -1) == 8
    ```
    """
    static = x.shape[axis]
    return static if static is not None else ops.shape(x)[axis]
