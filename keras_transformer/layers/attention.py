"""Multi-head attention (paper section 3.2.2) over the scaled dot-product
attention of `keras_transformer/ops/attention.py` (section 3.2.1).

Mask convention (the same as `keras.layers.MultiHeadAttention`): a mask entry
that is True (or 1) means the query MAY attend to that key; False (or 0) hides
the key. Masks broadcast to `(batch, heads, q_len, k_len)`. The tutorial that
the seed documents follow used the opposite convention (1 = hidden) and shipped
a look-ahead leak when the two were mixed, so every mask in this package is
built by `keras_transformer.layers.masks` and means "visible".
"""

import keras
from keras import ops

from keras_transformer import dispatch
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import TakesAttentionMask
from keras_transformer.ops.shapes import leading_axes


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(TakesAttentionMask, keras.layers.Layer):
    """Multi-head attention, paper section 3.2.2.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V). The h projections of size
    d_k = d_model / h are computed as one `d_model x d_model` matrix each
    (`wq`, `wk`, `wv`) and split into heads by `split_heads`; `dense` is W^O.

    Args:
        d_model: model width; must be divisible by `num_heads`.
        num_heads: number of heads h.
        dropout: dropout rate on the attention weights (0 in the paper).
        use_bias: whether the four projections have biases.
        kernel_initializer: initializer of the four projection kernels.

    Call arguments (the order of the seed layer: values, keys, queries):
        v: `(batch, k_len, d_v_in)`.
        k: `(batch, k_len, d_k_in)`.
        q: `(batch, q_len, d_q_in)`.
        mask: optional boolean broadcastable to `(batch, heads, q_len, k_len)`;
            True = may attend, False = hidden.
        training: enables dropout.
        return_attention_weights: when False, the weights are not returned
            (None in their place).

    Returns:
        `(output, attention_weights)`: `(batch, q_len, d_model)` and
        `(batch, heads, q_len, k_len)` float32 (or None, see above).

    Example:

    ```python
    import keras
    import keras_transformer as kt

    attention = kt.MultiHeadAttention(d_model=32, num_heads=4)
    q, kv = keras.random.normal((2, 3, 32)), keras.random.normal((2, 5, 32))
    output, weights = attention(kv, kv, q)          # call(v, k, q, mask)
    assert tuple(output.shape) == (2, 3, 32) and tuple(weights.shape) == (2, 4, 3, 5)
    ```
    """

    def __init__(
        self,
        d_model,
        num_heads,
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if d_model <= 0 or num_heads <= 0:
            raise ValueError(
                "`d_model` and `num_heads` must be positive, received "
                f"d_model={d_model}, num_heads={num_heads}."
            )
        if d_model % num_heads:
            raise ValueError(
                f"`d_model` ({d_model}) must be divisible by `num_heads` "
                f"({num_heads}) so that every head has d_model / num_heads "
                "dimensions."
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), received {dropout}.")
        self.d_model = d_model
        self.num_heads = num_heads
        self.depth = d_model // num_heads
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        def projection(name):
            return Dense(
                d_model,
                use_bias=use_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name=name,
            )

        self.wq = projection("wq")
        self.wk = projection("wk")
        self.wv = projection("wv")
        self.dense = projection("dense")
        self.attention_dropout = Dropout(dropout, dtype=self.dtype_policy)

    def build(self, v_shape, k_shape=None, q_shape=None):
        k_shape = v_shape if k_shape is None else k_shape
        q_shape = v_shape if q_shape is None else q_shape
        self.wv.build(v_shape)
        self.wk.build(k_shape)
        self.wq.build(q_shape)
        self.dense.build(tuple(q_shape[:-1]) + (self.d_model,))
        self.built = True

    def split_heads(self, x):
        """`(batch, len, d_model)` -> `(batch, heads, len, depth)`."""
        x = ops.reshape(x, leading_axes(x, 2) + (self.num_heads, self.depth))
        return ops.transpose(x, (0, 2, 1, 3))

    def merge_heads(self, x):
        """`(batch, heads, len, depth)` -> `(batch, len, d_model)`."""
        x = ops.transpose(x, (0, 2, 1, 3))
        return ops.reshape(x, leading_axes(x, 2) + (self.d_model,))

    def project_keys_and_values(self, k, v):
        """Projects and splits keys and values once, for reuse across steps.

        Encoder-decoder attention calls this once per sentence during
        incremental decoding (the memory does not change between steps).

        Returns:
            `(k_heads, v_heads)`, each `(batch, heads, k_len, depth)`.
        """
        return self.split_heads(self.wk(k)), self.split_heads(self.wv(v))

    def project_queries(self, q):
        """`(batch, q_len, d)` -> `(batch, heads, q_len, depth)`."""
        return self.split_heads(self.wq(q))

    def attend(
        self, q_heads, k_heads, v_heads, mask=None, training=None,
        return_attention_weights=True,
    ):
        """Attention over already projected heads, then the output projection.

        Args:
            q_heads: `(batch, heads, q_len, depth)`.
            k_heads, v_heads: `(batch, heads, k_len, depth)`.
            mask: see the class docstring.

        Returns:
            `(output, attention_weights)` as in `call`.
        """
        # Not `ops.dot_product_attention`: on TensorFlow it is two einsums
        # around a softmax, slower on CPU than these batched matmuls, and
        # cuDNN rejects the broadcast padding mask (docs/performance.md).
        out, weights = dispatch.attention(
            q_heads, k_heads, v_heads, mask,
            dropout=self.attention_dropout if self.dropout else None,
            training=training,
            return_attention_weights=return_attention_weights,
        )
        return self.dense(self.merge_heads(out)), weights if return_attention_weights else None

    def call(self, v, k, q, mask=None, training=None, return_attention_weights=True):
        k_heads, v_heads = self.project_keys_and_values(k, v)
        return self.attend(
            self.project_queries(q), k_heads, v_heads, mask,
            training=training,
            return_attention_weights=return_attention_weights,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            d_model=self.d_model,
            num_heads=self.num_heads,
            dropout=self.dropout,
            use_bias=self.use_bias,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
