"""`keras_transformer.ops.shapes`: axis sizes and reshape targets from the
static shape where it knows them, so that a traced projection or decoding
step carries no shape arithmetic for the axes it already knows."""

import textwrap

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_transformer as kt
from keras_transformer.ops.shapes import leading_axes, size
from test_api import EXAMPLE


@pytest.mark.parametrize("function", [leading_axes, size], ids=lambda f: f.__name__)
def test_example_runs(function):
    (code,) = EXAMPLE.findall(function.__doc__)
    exec(compile(textwrap.dedent(code), f"<{function.__name__} example>", "exec"), {})


def graph_of(function, *specs):
    """The ops of `function` traced for `specs`."""
    return tf.function(function).get_concrete_function(*specs).graph.get_operations()


def op_types(operations):
    return [op.type for op in operations]


def test_static_sizes_are_python_ints_and_unknown_ones_tensors():
    seen = {}

    def trace(x, y):
        seen["size"] = [size(x, axis) for axis in range(3)]
        seen["two unknown"] = leading_axes(x, 2)
        seen["one unknown"] = leading_axes(y, 2)
        return x

    graph_of(trace, tf.TensorSpec((None, None, 8)), tf.TensorSpec((None, 3, 8)))
    assert seen["size"][2] == 8 and all(tf.is_tensor(s) for s in seen["size"][:2])
    assert all(tf.is_tensor(s) for s in seen["two unknown"])
    assert seen["one unknown"] == (-1, 3)
    x = ops.ones((2, 3, 8))
    assert size(x, 0) == 2 and leading_axes(x, 2) == (2, 3)


@pytest.mark.parametrize("batch,length", [(None, 1), (None, None), (4, None)])
def test_reshapes_give_the_shapes_keras_shape_gives(batch, length):
    """A reshape to `leading_axes(x, 2) + tail` equals one to
    `ops.shape(x)[:2] + tail` for every pattern of unknown axes."""
    def both(x):
        ours = ops.reshape(x, leading_axes(x, 2) + (2, 4))
        theirs = ops.reshape(x, tuple(ops.shape(x)[:2]) + (2, 4))
        return ours, theirs

    function = tf.function(both, input_signature=[tf.TensorSpec((batch, length, 8))])
    x = np.arange(4 * 5 * 8, dtype="float32").reshape(4, 5, 8)[:, : length or 5]
    ours, theirs = function(x)
    assert ours.shape == theirs.shape == x.shape[:2] + (2, 4)
    np.testing.assert_array_equal(ours, theirs)


def test_a_decoding_steps_projections_read_no_shape():
    """In a decoding step the batch is the only unknown axis of a
    `(batch, 1, d_model)` input: splitting it into heads, merging them and
    the projections then need no `Shape` op. With an unknown length too,
    each split or merge reads the shape once."""
    attention = kt.MultiHeadAttention(d_model=32, num_heads=4)
    attention.build((None, 1, 32))

    def step(x):
        heads = attention.split_heads(attention.wq(x))
        return attention.dense(attention.merge_heads(heads))

    assert "Shape" not in op_types(graph_of(step, tf.TensorSpec((None, 1, 32))))
    assert op_types(graph_of(step, tf.TensorSpec((None, None, 32)))).count("Shape") == 4
