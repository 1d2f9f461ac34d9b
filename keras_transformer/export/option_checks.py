"""The search options on TensorFlow's side: the Python checks of an
in-process call and the graph checks of the SavedModel's signatures, both
from the one table, `keras_transformer.decoding.search_options.OPTIONS`.
TensorFlow-only module."""

import tensorflow as tf

from keras_transformer.decoding.search_options import (
    OPTIONS,
    check_options,
)


def nbest_beam_size(n, beam_size, default_beam_size):
    """The beam size of an n-best search: `beam_size`, or with None
    `max(n, default_beam_size)`. `ValueError` unless `1 <= n <= beam
    size` (`search_options.OPTIONS["n"]`)."""
    OPTIONS["n"].check(n)
    beam_size = max(n, default_beam_size) if beam_size is None else beam_size
    check_options({"beam_size": beam_size, "n": n})
    return beam_size


def sampling_options(temperature, top_k, top_p, seed):
    """The sampling options as the tensors the `translate_sample` signature
    takes, after the Python-side checks (`ValueError` naming the option)."""
    check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p,
                   "seed": seed})
    return (tf.constant(temperature, tf.float32), tf.constant(top_k, tf.int32),
            tf.constant(top_p, tf.float32), tf.constant(seed, tf.int64))


def graph_checks(values, context=None):
    """`tf.debugging.Assert`s of `values` (`{option name: scalar tensor}`)
    against `search_options.OPTIONS`: the same ranges and words as the
    Python checks, so that TF Serving answers InvalidArgument with
    `"<name> must be <rule>, received" <value>`. Integers are compared in
    int64, so no value wraps into range. `context`: the bounds' context
    (numbers or tensors)."""
    checks = []
    for name, value in values.items():
        option = OPTIONS[name]
        low, high = option.bounds(context)
        integer = option.dtype != "float32"
        wide = tf.cast(value, tf.int64) if integer else value
        ok = tf.constant(True)
        if not integer:
            ok &= tf.math.is_finite(value) if option.finite else ~tf.math.is_nan(value)
        if low is not None:
            ok &= (wide > low) if option.exclusive_minimum else (wide >= low)
        if high is not None:
            ok &= wide <= (tf.cast(high, wide.dtype) if tf.is_tensor(high) else high)
        checks.append(tf.debugging.Assert(
            ok, [f"{name} must be {option.rule(context)}, received", value]))
    return checks


def check_search_options(beam_size, extra_length, vocab_size, alpha=None):
    """Python-side checks of the search options (`search_options.OPTIONS`):
    `ValueError` naming the first out of range. Those that fix shapes
    must be Python ints; `alpha` may be a tensor."""
    check_options({"beam_size": beam_size, "extra_length": extra_length},
                  {"vocabulary": vocab_size})
    check_options({"alpha": alpha}, tensors_pass=True)
