"""TF Model Garden's `Seq2SeqTransformer` with the same shapes as ours: the
reference the benchmark compares against.

Optional, benchmark-only dependency, never imported by the library. Install
into the project's virtual environment with `bash benchmarks/install_model_garden.sh`.
"""

import tensorflow as tf


def available():
    try:
        import official.nlp.modeling.models.seq2seq_transformer  # noqa: F401
        import tf_keras  # noqa: F401
    except ImportError:
        return False
    return True


def build(config, beam_size=4, alpha=0.6, extra_decode_length=10, precision="float32"):
    """A Model Garden `Seq2SeqTransformer` matching `config` (post-LN when
    `config.norm_first` is False, shared tied embedding, same dropout)."""
    import tf_keras
    from official.nlp.modeling.models import seq2seq_transformer as mg

    tf_keras.mixed_precision.set_global_policy(precision)
    layer_args = dict(
        num_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.d_ff,
        dropout_rate=config.dropout,
        attention_dropout_rate=config.attention_dropout,
        intermediate_dropout=config.activation_dropout,
        use_bias=True,
        norm_first=config.norm_first,
        norm_epsilon=config.layer_norm_epsilon,
    )
    model = mg.Seq2SeqTransformer(
        vocab_size=config.vocab_size,
        embedding_width=config.d_model,
        dropout_rate=config.dropout,
        encoder_layer=mg.TransformerEncoder(**layer_args),
        decoder_layer=mg.TransformerDecoder(**layer_args),
        beam_size=beam_size,
        alpha=alpha,
        extra_decode_length=extra_decode_length,
        eos_id=config.eos_id,
    )
    optimizer = tf_keras.optimizers.Adam(1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    return model, optimizer


def train_step_fn(model, optimizer, label_smoothing, pad_id):
    """A compiled training step: label-smoothed cross-entropy over real
    tokens (the same loss our benchmark uses), Adam update.

    `target_in` (bos + target) is unused: Model Garden shifts the targets
    right inside `call`, starting from id 0 as its beam search does, so it
    is given `target_out` (target + eos) and predicts each of its tokens
    from the ones before. Traced once for any batch shape, as the
    length-bucketed batches have many."""

    ids = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[ids, ids, ids])
    def step(source, target_in, target_out):
        del target_in
        with tf.GradientTape() as tape:
            logits = tf.cast(model({"inputs": source, "targets": target_out}, training=True),
                             tf.float32)
            vocab = tf.shape(logits)[-1]
            confidence = 1.0 - label_smoothing
            low = label_smoothing / tf.cast(vocab - 1, tf.float32)
            soft = tf.one_hot(target_out, vocab, on_value=confidence, off_value=low)
            per_token = tf.nn.softmax_cross_entropy_with_logits(soft, logits)
            weights = tf.cast(tf.not_equal(target_out, pad_id), tf.float32)
            loss = tf.reduce_sum(per_token * weights) / tf.reduce_sum(weights)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def translate_fn(model):
    """Beam search over a `[batch, src_len]` id batch (Model Garden's own)."""

    @tf.function
    def translate(source):
        return model({"inputs": source}, training=False)["outputs"]

    return translate
