"""The one door to the TensorFlow-only fast paths.

Layers, the loss and the optimizer factory call the functions below. Each
computes the portable `keras.ops` form (`keras_transformer/ops/`) unless a
fast path of `keras_transformer/kernels/` applies, and this module alone
decides when one does: the backend, which kernels TensorFlow multiplies
float32 with (oneDNN, Eigen, a GPU's, or XLA's inside a compiled function),
the precision, and whether the model is training. A fast path computes the
same values as the portable form, up to float32 rounding (the random bits of
dropout excepted); exported serving signatures never take one (column blocks,
below, are an export option, not one of these paths).

The fast paths, by the name the switches below use:

    fused_adam           Adam's update of a variable as one kernel
                         (TensorFlow; `kernels/adam.py`).
    fused_cross_entropy  the label-smoothed loss as two XLA clusters with
                         a closed-form gradient (TensorFlow training;
                         `kernels/cross_entropy.py`).
    philox_dropout       dropout, the residual add and the post-LN norm as
                         XLA clusters (TensorFlow training;
                         `kernels/dropout.py`).
    eigen_slices         products whose result rows are a multiple of 2,048
                         floats, in slices of 1,024 columns (TensorFlow
                         float32 training where it multiplies with Eigen;
                         `kernels/eigen_slices.py`, `kernels/dense.py`,
                         `kernels/vocabulary_projection.py`).
    compiled_attention   the attention core as one XLA function (TensorFlow
                         float32 training where it multiplies with Eigen,
                         no attention dropout; `kernels/attention.py`).

docs/performance.md gives each one's measured gain and the command that
measured it.

Switches, read from the environment at import and settable with
`configure()` (or, in a `with` block, `configured()`):

    KT_FAST_PATHS=auto|off         off: the portable form everywhere.
    KT_DISABLE_FAST_PATHS=a,b      the named paths off, the others as usual.
    KT_MATMUL_KERNELS=auto|onednn|eigen
                                   decide as if TensorFlow multiplied with
                                   these kernels: tests force the path that
                                   only the other CPU kind takes.

Decisions are made when a function is traced: change a switch before
building (or retracing) the step it should apply to.

Column blocks are not a switch but an export option
(`Translator(xla_column_blocks=n)`, `kt-export --xla-column-blocks`): the
decoder's products `x W` taken as `[x W_1, ..., x W_n]` from copies of the
weights cut into column blocks (`kernels/column_blocks.py`), which XLA:CPU
may run side by side on its threads; the same math, results equal to
float32 rounding. The export makes the copies
(`keras_transformer/export/column_blocks.py`) and traces its XLA search
inside `using_column_blocks`; there `dense` and `decoding_logits`, outside
training, multiply a product of at most `COLUMN_BLOCK_MAX_ROWS` rows by the
blocks of its layer. Nothing else takes them, and the switches above do not
apply to them.
"""

import contextlib
import os
import threading

import keras
from keras import ops

from keras_transformer.ops import attention as portable_attention
from keras_transformer.ops import dropout as portable_dropout
from keras_transformer.ops import label_smoothing as portable_loss
from keras_transformer.ops.shapes import leading_axes, size

FAST_PATHS = ("fused_adam", "fused_cross_entropy", "philox_dropout", "eigen_slices",
              "compiled_attention")
MATMUL_KERNELS = ("auto", "onednn", "eigen")
# Products of up to 8 sentences at beam 4 take column blocks; at the 128
# rows of 32 sentences the blocks cost throughput (docs/performance.md).
COLUMN_BLOCK_MAX_ROWS = 32
_COLUMN_BLOCK_SCOPES = threading.local()  # each thread traces with its own scopes


def _names(text):
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def _validated(fast_paths, disabled, matmul_kernels):
    if fast_paths not in ("auto", "off"):
        raise ValueError(f"fast_paths (KT_FAST_PATHS) must be 'auto' or 'off', "
                         f"received {fast_paths!r}.")
    unknown = sorted(set(disabled) - set(FAST_PATHS))
    if unknown:
        raise ValueError(f"Unknown fast path(s) {unknown} (KT_DISABLE_FAST_PATHS); "
                         f"the fast paths are {list(FAST_PATHS)}.")
    if matmul_kernels not in MATMUL_KERNELS:
        raise ValueError(f"matmul_kernels (KT_MATMUL_KERNELS) must be one of "
                         f"{MATMUL_KERNELS}, received {matmul_kernels!r}.")
    return {"fast_paths": fast_paths, "disabled": frozenset(disabled),
            "matmul_kernels": matmul_kernels}


_settings = _validated(os.environ.get("KT_FAST_PATHS", "auto"),
                       _names(os.environ.get("KT_DISABLE_FAST_PATHS", "")),
                       os.environ.get("KT_MATMUL_KERNELS", "auto"))


def configure(fast_paths=None, disabled=None, matmul_kernels=None):
    """Sets the switches (None keeps one as it is).

    Args:
        fast_paths: "auto" or "off".
        disabled: names from `FAST_PATHS` to turn off.
        matmul_kernels: "auto", "onednn" or "eigen".

    Returns: the previous settings, a dict to pass back as `configure(**previous)`.
    """
    global _settings
    previous = dict(_settings)
    _settings = _validated(
        previous["fast_paths"] if fast_paths is None else fast_paths,
        previous["disabled"] if disabled is None else disabled,
        previous["matmul_kernels"] if matmul_kernels is None else matmul_kernels)
    return previous


@contextlib.contextmanager
def configured(**settings):
    """`configure(**settings)` for the duration of a `with` block."""
    previous = configure(**settings)
    try:
        yield
    finally:
        configure(**previous)


def enabled(name):
    """Whether fast path `name` may be taken: the TensorFlow backend, and the
    switches leave it on. (Each path's own conditions come on top.)"""
    if name not in FAST_PATHS:
        raise ValueError(f"Unknown fast path {name!r}; the fast paths are {list(FAST_PATHS)}.")
    return (keras.backend.backend() == "tensorflow" and _settings["fast_paths"] == "auto"
            and name not in _settings["disabled"])


def multiplies_with_eigen():
    """Whether float32 products built here run on Eigen's kernels in
    TensorFlow's executor: TensorFlow without oneDNN (or
    `matmul_kernels="eigen"`), no GPU to place them on, and not inside a
    function XLA compiles (XLA emits its own products there)."""
    if keras.backend.backend() != "tensorflow":
        return False
    from keras_transformer.kernels import platform

    if platform.inside_xla_compilation():
        return False
    if _settings["matmul_kernels"] != "auto":
        return _settings["matmul_kernels"] == "eigen"
    return not platform.tensorflow_uses_onednn() and not platform.has_gpu()


def _float32(*tensors):
    return all(keras.backend.standardize_dtype(t.dtype) == "float32" for t in tensors)


def slices_pay(width):
    """Whether a float32 training product whose result rows are `width`
    floats long is computed in slices (`eigen_slices`): Eigen's contraction
    is slow for rows a multiple of 2,048 floats."""
    if not enabled("eigen_slices"):
        return False
    from keras_transformer.kernels import eigen_slices

    return width % eigen_slices.SLOW_WIDTH_MULTIPLE == 0 and multiplies_with_eigen()


def dense(layer, inputs, training, portable):
    """A `keras.layers.Dense` subclass's product for 2-D `inputs`
    `(rows, d_in)` -> `(rows, units)`.

    Float32 training on TensorFlow, with ReLU or no activation and none of
    Keras's LoRA or quantized variants, takes `kernels/dense.py` (the same
    forward ops, the gradient written out) where `eigen_slices` applies to
    a side of a multiple of 2,048 units. Outside training, inside
    `using_column_blocks` with blocks for `layer`, a product of at most
    `COLUMN_BLOCK_MAX_ROWS` rows is taken block by block
    (`kernels/column_blocks.py`). Otherwise
    `portable(inputs, training=training)` (the layer's Keras `call`).
    """
    def whole():
        return portable(inputs, training=training)

    if training:
        if _dense_eligible(layer, inputs):
            sliced_inputs = slices_pay(layer.kernel.shape[0])
            sliced_outputs = slices_pay(layer.units)
            if sliced_inputs or sliced_outputs:
                from keras_transformer.kernels import dense as kernel

                return kernel.dense(inputs, layer.kernel, layer.bias,
                                    relu=layer.activation is keras.activations.relu,
                                    sliced_inputs=sliced_inputs,
                                    sliced_outputs=sliced_outputs)
        return whole()
    blocks = _column_blocks_of(layer)
    if blocks is None:
        return whole()
    from keras_transformer.kernels import column_blocks

    return _few_rows(inputs, lambda: column_blocks.dense(inputs, blocks, layer.activation),
                     whole)


def _dense_eligible(layer, inputs):
    return (keras.backend.backend() == "tensorflow"
            and layer.compute_dtype == "float32" and _float32(inputs)
            and layer.activation in (keras.activations.relu, keras.activations.linear)
            and not getattr(layer, "lora_enabled", False)
            and getattr(layer, "quantization_mode", None) is None)


def vocabulary_logits(x, table):
    """The training form of the tied pre-softmax projection `x E^T` (paper
    section 3.4): `x` `(..., d_model)`, `table` `(vocab, d_model)` of `x`'s
    dtype -> `(..., vocab)` in `x`'s dtype. In slices of the vocabulary
    (`eigen_slices`, `kernels/vocabulary_projection.py`) for a float32
    vocabulary of a multiple of 2,048 where TensorFlow multiplies with
    Eigen."""
    if not (keras.backend.backend() == "tensorflow" and _float32(x)
            and slices_pay(table.shape[0])):
        return ops.matmul(x, ops.transpose(table))
    from keras_transformer.kernels import vocabulary_projection

    logits = vocabulary_projection.logits(ops.reshape(x, (-1, size(x, -1))), table)
    return ops.reshape(logits, leading_axes(x, len(x.shape) - 1) + (table.shape[0],))


def decoding_logits(layer, rows, table):
    """The tied pre-softmax projection outside training (paper section
    3.4): `rows` `(n, d_model)`, `table` `(vocab, d_model)` of `rows`'
    dtype -> `(n, vocab)` in `rows`' dtype.

    Computed as `(E x^T)^T`, the same products as `x E^T`: TensorFlow's CPU
    matmul is slow with the large operand transposed and few rows, which is
    every decoding step (XLA compiles the two forms alike). Inside
    `using_column_blocks` with row blocks of `E` for `layer` (the
    `TokenEmbedding`), a product of at most `COLUMN_BLOCK_MAX_ROWS` rows is
    taken block by block (`kernels/column_blocks.py`).
    """
    def whole():
        return ops.transpose(ops.matmul(table, ops.transpose(rows)))

    blocks = _column_blocks_of(layer)
    if blocks is None:
        return whole()
    from keras_transformer.kernels import column_blocks

    return _few_rows(rows, lambda: column_blocks.table_logits(rows, blocks), whole)


def _column_block_stack():
    if not hasattr(_COLUMN_BLOCK_SCOPES, "stack"):
        _COLUMN_BLOCK_SCOPES.stack = []
    return _COLUMN_BLOCK_SCOPES.stack


@contextlib.contextmanager
def using_column_blocks(blocks_by_layer):
    """While active in this thread, `dense` and `decoding_logits` find a
    layer's column blocks in `blocks_by_layer`, a mapping from `id` of a
    layer to its blocks: for a `Dense`, `[(kernel_i (d_in, c_i), bias_i
    (c_i,) or None), ...]`; for a `TokenEmbedding`, row blocks of its table
    `[E_i (v_i, d_model), ...]`. Meant around the tracing of a search: what
    is traced keeps the blocks. The innermost active scope applies."""
    stack = _column_block_stack()
    stack.append(blocks_by_layer)
    try:
        yield
    finally:
        stack.pop()


def _column_blocks_of(layer):
    """`layer`'s blocks in the innermost active `using_column_blocks`, or
    None."""
    stack = _column_block_stack()
    return stack[-1].get(id(layer)) if stack else None


def _few_rows(rows, blocked, whole):
    """`blocked()` if `rows` `(n, d)` has at most `COLUMN_BLOCK_MAX_ROWS`
    rows, else `whole()`. With `n` unknown when traced (a SavedModel
    signature's batch), a conditional on it chooses; XLA compiles each
    batch shape on its own and keeps only the branch that shape takes."""
    n = rows.shape[0]
    if n is not None:
        return blocked() if n <= COLUMN_BLOCK_MAX_ROWS else whole()
    return ops.cond(ops.shape(rows)[0] <= COLUMN_BLOCK_MAX_ROWS, blocked, whole)


def attention(q, k, v, mask=None, dropout=None, training=None, return_attention_weights=True):
    """Scaled dot-product attention over heads (paper section 3.2.1):
    `(output, weights)` as `ops.attention.scaled_dot_product_attention`
    returns them (`weights` None when not asked for).

    `q`: `(batch, heads, q_len, depth)`, `k`, `v`: `(batch, heads, k_len,
    depth)`, `mask` boolean broadcastable to `(batch, heads, q_len, k_len)`.
    Float32 training without attention dropout and without the weights,
    where TensorFlow multiplies with Eigen, takes `compiled_attention`.
    """
    if (training and not return_attention_weights and dropout is None
            and enabled("compiled_attention") and _float32(q) and multiplies_with_eigen()):
        from keras_transformer.kernels import attention as kernel

        return kernel.attention(q, k, v, None if mask is None else ops.cast(mask, "bool")), None
    output, weights = portable_attention.scaled_dot_product_attention(
        q, k, v, mask, dropout=dropout, training=training)
    return output, weights if return_attention_weights else None


def dropout(x, rate, seed, residual=None):
    """`residual + dropout(x)` (or `dropout(x)`), 16 random bits per element
    (`ops/dropout.py`); on TensorFlow as one XLA cluster with Philox bits
    (`philox_dropout`). `seed`: a `keras.random.SeedGenerator` or an int."""
    threshold = portable_dropout.keep_threshold(rate)
    if threshold and enabled("philox_dropout"):
        from keras_transformer.kernels import dropout as kernel

        return kernel.dropout(x, threshold, portable_dropout.keep_scale(rate), seed, residual)
    return portable_dropout.dropout(x, rate, seed, residual)


def dropout_add_norm(x, residual, norm, dropout_layer, training=None):
    """The post-LN sub-layer connection `norm(residual + dropout(x))`
    (paper sections 3.1 and 5.4). `norm`: a `LayerNormalization` layer;
    `dropout_layer`: a `Dropout` layer. In training on TensorFlow with a
    non-zero rate, one XLA cluster forward and one backward
    (`philox_dropout`); otherwise the two layers."""
    rate = dropout_layer.rate
    threshold = portable_dropout.keep_threshold(rate)
    if training and threshold and enabled("philox_dropout"):
        from keras_transformer.kernels import dropout as kernel

        return kernel.dropout_add_norm(
            x, residual, ops.cast(norm.gamma, "float32"), ops.cast(norm.beta, "float32"),
            norm.epsilon, threshold, portable_dropout.keep_scale(rate),
            dropout_layer.seed_generator)
    return norm(dropout_layer(x, training=training, residual=residual))


def label_smoothed_cross_entropy(y_true, y_pred, label_smoothing, pad_id):
    """Per-token KL(smoothed target || model), `(batch, tgt_len)` float32
    (`ops/label_smoothing.py`); on TensorFlow as two XLA clusters with the
    gradient in closed form (`fused_cross_entropy`)."""
    if enabled("fused_cross_entropy"):
        from keras_transformer.kernels import cross_entropy

        return cross_entropy.label_smoothed_cross_entropy(y_true, y_pred, label_smoothing,
                                                          pad_id)
    return portable_loss.label_smoothed_cross_entropy(y_true, y_pred, label_smoothing, pad_id)


def adam_class():
    """The Adam optimizer class to build: `kernels.adam.FusedAdam` (Keras's
    Adam, each variable's update one TensorFlow kernel; `fused_adam`) on
    TensorFlow, `keras.optimizers.Adam` elsewhere. Same arguments, same
    results."""
    if enabled("fused_adam"):
        from keras_transformer.kernels.adam import FusedAdam

        return FusedAdam
    return keras.optimizers.Adam
