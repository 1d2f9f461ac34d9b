"""The Transformer (paper section 3, Figure 1) as a subclassed `keras.Model`."""

import contextlib
import contextvars
import inspect
import weakref

import keras
from keras import ops

from keras_transformer import distribute
from keras_transformer.config import TransformerConfig
from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.dense import Dense
from keras_transformer.layers.embedding import PositionalEmbedding, TokenEmbedding
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.masks import causal_mask, padding_mask
from keras_transformer.losses import normalizing_weights, real_token_weights
from keras_transformer.ops.shapes import size
from keras_transformer.r_drop import r_drop_term

# The epoch iterators that Keras's trainer shows `_maybe_symbolic_build`
# during the outermost `fit` or `evaluate` running in this context (weak
# references); None outside them.
_EPOCH_ITERATORS = contextvars.ContextVar("epoch_iterators", default=None)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer for translation.

    Args:
        config: a `TransformerConfig` (or its dict).

    Call:
        inputs: `(source_ids, target_input_ids)`, int `(batch, src_len)` and
            `(batch, tgt_len)`; `target_input_ids` is the target shifted
            right, starting with `config.bos_id`.
        training: enables dropout.

    Returns: logits `(batch, tgt_len, output_vocab_size)`, float32 under any
    dtype policy.

    Source padding (`config.pad_id`) is masked out of every attention over the
    source; the decoder's self-attention is causal. With a shared vocabulary
    (the default) one embedding matrix serves the source, the target and the
    pre-softmax projection (3.4).

    Loss normalisation: `compute_loss` gives Keras per-token weights so that
    the compiled loss (e.g. `LabelSmoothedCrossEntropy`, reduction
    "sum_over_batch_size") is the sum over real target tokens divided by the
    number of real target tokens in the *global* batch, summed over replicas
    under `tf.distribute`. With `config.r_drop` > 0 a training batch goes
    through the model a second time and the loss is R-Drop's
    (`keras_transformer/r_drop.py`): the mean of the two cross-entropies
    plus `r_drop` times the symmetric KL between the two passes.

    Example:

    ```python
    import keras
    import keras_transformer as kt

    config = kt.get_config("tiny", vocab_size=100)
    model = kt.Transformer(config)
    source = keras.ops.convert_to_tensor([[5, 6, 7, 3]])         # tokens + eos
    target_input = keras.ops.convert_to_tensor([[2, 8, 9]])      # bos + tokens
    logits = model((source, target_input))
    assert tuple(logits.shape) == (1, 3, 100)
    ```
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, TransformerConfig):
            raise TypeError(
                f"`config` must be a TransformerConfig or dict, received {type(config)}."
            )
        self.config = config
        policy = self.dtype_policy
        c = config
        source_tokens = TokenEmbedding(
            c.vocab_size, c.d_model, dtype=policy,
            name="shared_embedding" if c.shared_vocabulary else "source_embedding")
        target_tokens = (
            source_tokens
            if c.shared_vocabulary
            else TokenEmbedding(c.target_vocab_size, c.d_model, dtype=policy,
                                name="target_embedding")
        )
        embedding_args = dict(
            position_encoding=c.position_encoding, max_length=c.max_length,
            dropout=c.dropout, dtype=policy,
        )
        self.source_embedding = PositionalEmbedding(
            source_tokens, name="source_positional_embedding", **embedding_args
        )
        self.target_embedding = PositionalEmbedding(
            target_tokens, name="target_positional_embedding", **embedding_args
        )
        stack_args = dict(
            d_model=c.d_model, num_heads=c.num_heads, d_ff=c.d_ff, dropout=c.dropout,
            attention_dropout=c.attention_dropout,
            activation_dropout=c.activation_dropout, norm_first=c.norm_first,
            epsilon=c.layer_norm_epsilon, layer_drop=c.layer_drop, dtype=policy,
        )
        self.encoder = Encoder(c.num_layers, name="encoder", **stack_args)
        self.decoder = Decoder(c.decoder_layers, name="decoder", **stack_args)
        self.output_projection = (
            None
            if c.tie_output_projection
            else Dense(c.output_vocab_size, dtype=policy, name="output_projection")
        )

    # Building ---------------------------------------------------------------

    def build(self, inputs_shape=None):
        d = self.config.d_model
        self.source_embedding.build((None, None))
        self.target_embedding.build((None, None))
        self.encoder.build((None, None, d))
        self.decoder.build((None, None, d), (None, None, d))
        if self.output_projection is not None:
            self.output_projection.build((None, None, d))
        self.built = True

    # The three pieces of the forward pass -----------------------------------

    def encode(self, source_ids, training=None, return_attention_weights=False):
        """`(batch, src_len)` -> `(memory (batch, src_len, d_model),
        memory_mask (batch, 1, 1, src_len))`, plus per-layer weights when asked."""
        memory_mask = padding_mask(source_ids, self.config.pad_id)
        x = self.source_embedding(source_ids, training=training)
        out = self.encoder(x, memory_mask, training=training,
                           return_attention_weights=return_attention_weights)
        if return_attention_weights:
            memory, weights = out
            return memory, memory_mask, weights
        return out, memory_mask

    def project(self, x, training=None):
        """Decoder output `(..., d_model)` -> float32 logits `(..., vocab)`."""
        if self.output_projection is None:
            return self.target_embedding.token_embedding.logits(x, training=training)
        return ops.cast(self.output_projection(x), "float32")

    def decode(self, target_input_ids, memory, memory_mask, training=None,
               return_attention_weights=False):
        """Teacher-forced decoder: `(batch, tgt_len)` -> logits
        `(batch, tgt_len, vocab)` (plus per-layer weights when asked)."""
        x = self.target_embedding(target_input_ids, training=training)
        self_mask = causal_mask(size(target_input_ids, 1))
        out = self.decoder(x, memory, self_mask, memory_mask, training=training,
                           return_attention_weights=return_attention_weights)
        if return_attention_weights:
            x, weights = out
            return self.project(x, training=training), weights
        return self.project(out, training=training)

    def call(self, inputs, training=None):
        source_ids, target_input_ids = _unpack_inputs(inputs)
        memory, memory_mask = self.encode(source_ids, training=training)
        return self.decode(target_input_ids, memory, memory_mask, training=training)

    def attention_weights(self, source_ids, target_input_ids):
        """Every attention map of one forward pass, for visualisation.

        Returns: a dict with `encoder_self`, `decoder_self` and
        `decoder_cross`, each a list (one per layer) of float32
        `(batch, heads, q_len, k_len)` arrays.
        """
        memory, memory_mask, encoder_weights = self.encode(
            source_ids, training=False, return_attention_weights=True
        )
        _, decoder_weights = self.decode(
            target_input_ids, memory, memory_mask, training=False,
            return_attention_weights=True,
        )
        return {
            "encoder_self": encoder_weights,
            "decoder_self": [w[0] for w in decoder_weights],
            "decoder_cross": [w[1] for w in decoder_weights],
        }

    # Incremental decoding ---------------------------------------------------

    def init_decoding_cache(self, memory, max_length):
        """Fixed-shape decoding state for `max_length` target positions:
        per layer, zeroed self-attention keys/values and the encoder-decoder
        keys/values computed once (see `Decoder.init_cache`)."""
        return self.decoder.init_cache(memory, max_length)

    def decode_step(self, ids, step, cache, memory_mask, parents=None):
        """Logits for position `step` given the token at that position.

        Args:
            ids: `(batch,)` int, the token at position `step` (`bos_id` at 0).
            step: scalar int.
            cache: from `init_decoding_cache` (or a previous step).
            memory_mask: `(batch, 1, 1, src_len)`.
            parents: optional `(batch,)` int: row `i` continues the
                hypothesis in row `parents[i]` of `cache` (beam search); the
                self-attention caches are reordered as they are written.

        Returns: `(logits (batch, vocab) float32, new_cache)`.
        """
        x = self.target_embedding(ops.expand_dims(ids, 1), start_index=step, training=False)
        x, cache = self.decoder.decode_step(x, step, cache, memory_mask, parents)
        return self.project(x)[:, 0, :], cache

    # Training ---------------------------------------------------------------

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        if y is not None and self._compile_loss is not None:
            weights = real_token_weights(y, self.config.pad_id, sample_weight)
            total_tokens, replicas = distribute.sum_over_replicas(ops.sum(weights))
            sample_weight = normalizing_weights(weights, total_tokens, replicas)
            loss = super().compute_loss(x, y, y_pred, sample_weight, training)
            if training and self.config.r_drop > 0:
                # A second pass: other dropout masks, the same batch.
                again = self(x, training=True)
                loss = 0.5 * (loss + super().compute_loss(x, y, again, sample_weight, training))
                loss = loss + self.config.r_drop * r_drop_term(y_pred, again, weights,
                                                               total_tokens)
            if replicas > 1:
                # Keras's loss tracker averages the replicas' values weighted
                # by their batch sizes, which misreports token-bucketed
                # batches; report the global value from every replica. The
                # gradient is unchanged (stop_gradient).
                global_loss, _ = distribute.sum_over_replicas(loss)
                loss = loss + ops.stop_gradient(global_loss / replicas - loss)
            return loss
        return super().compute_loss(x, y, y_pred, sample_weight, training)

    # TensorFlow's trainer calls `train_step(data)` and gets logs; JAX's calls
    # `train_step(state, data)` and gets `(logs, state)`, which
    # `multi_worker_safe_logs` returns untouched (it acts on TensorFlow only).
    def train_step(self, *args):
        return distribute.multi_worker_safe_logs(super().train_step(*args))

    def test_step(self, *args):
        return distribute.multi_worker_safe_logs(super().test_step(*args))

    def fit(self, *args, **kwargs):
        """`keras.Model.fit`, which deletes its input iterators when it returns.

        When training stops before an epoch's end (`stop_training`: a step
        budget, a time budget, a signal, early stopping), Keras 3.15 leaves
        that epoch's batch generator suspended in a reference cycle with the
        epoch iterator, which holds the `tf.data` iterator; so does every
        pass over a dataset of unknown length, which ends when the data runs
        out. That iterator then outlives the call until a full garbage
        collection, its autotuning thread sleeping ever longer periods, and
        the collection that deletes it can wait up to a minute for that
        thread with every core idle
        (docs/performance.md#deleting-an-autotuned-iterator). Closing the
        generators here ends the cycles. Keras's TensorFlow trainer shows
        them to `_maybe_symbolic_build`; under JAX nothing is released.
        """
        with _epoch_iterators_released():
            return super().fit(*args, **kwargs)

    def evaluate(self, *args, **kwargs):
        """`keras.Model.evaluate`, which deletes its input iterator when it
        returns (see `fit`); inside `fit`, `fit` does."""
        with _epoch_iterators_released():
            return super().evaluate(*args, **kwargs)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        seen = _EPOCH_ITERATORS.get()
        if seen is not None and iterator is not None:
            seen.append(weakref.ref(iterator))
        # Without a strategy at construction Keras builds while tracing the
        # step and ignores the batch; pulling one anyway would open a
        # throwaway iterator, which takes shuffle seeds from the dataset's
        # generator (shared by its iterators) that training would have had.
        if getattr(self, "_distribute_strategy", None) is None:
            return super()._maybe_symbolic_build(data_batch=data_batch)
        # Keras 3.15 on TF pulls a batch at every fit/evaluate, then drops
        # that half-read iterator, whose teardown can idle every core for
        # tens of seconds; once all is built no batch is needed.
        if iterator is not None and data_batch is None and not self._needs_symbolic_build():
            iterator = None
        # Keras 3.15 on TF builds the compiled metrics from the first batch
        # of a distributed dataset averaged over replicas, which fails when
        # replicas hold token-bucketed batches of different shapes. Only
        # shapes and dtypes matter there: build from one replica's batch.
        if iterator is not None and data_batch is None:
            data_batch = distribute.first_replica_batch(iterator)
            if data_batch is not None:
                iterator = None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def _needs_symbolic_build(self):
        """Whether a layer, the compiled metrics or the compiled loss still
        wants a batch's shapes to build (the test of Keras's
        `_symbolic_build`)."""
        def unbuilt(obj):
            return obj is not None and not obj.built

        return (not all(layer.built for layer in self._flatten_layers())
                or unbuilt(self._compile_metrics) or unbuilt(self._compile_loss))

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _unpack_inputs(inputs):
    if isinstance(inputs, dict):
        return inputs["source_ids"], inputs["target_input_ids"]
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        return inputs
    raise ValueError(
        "Transformer expects `(source_ids, target_input_ids)` or a dict with "
        f"those keys, received {type(inputs).__name__}."
    )


@contextlib.contextmanager
def _epoch_iterators_released():
    if _EPOCH_ITERATORS.get() is not None:
        # Within `fit`: its validation reuses the iterator; `fit` releases it.
        yield
        return
    token = _EPOCH_ITERATORS.set([])
    try:
        yield
    finally:
        for ref in _EPOCH_ITERATORS.get():
            _release_epoch_iterator(ref())
        _EPOCH_ITERATORS.reset(token)


def _release_epoch_iterator(epoch_iterator):
    """Closes a Keras epoch iterator's suspended batch generator and drops the
    input iterator it holds (`None` and objects without them are left alone)."""
    generator = getattr(epoch_iterator, "_epoch_iterator", None)
    if inspect.isgenerator(generator):
        generator.close()
    if hasattr(epoch_iterator, "_current_iterator"):
        epoch_iterator._current_iterator = None
