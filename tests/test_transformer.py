import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from support.common import random_ids


def test_logits_shape_and_dtype(tiny_config):
    model = kt.Transformer(tiny_config)
    logits = model((random_ids((3, 7)), random_ids((3, 5))))
    assert tuple(logits.shape) == (3, 5, 40)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_causality(tiny_config):
    """Changing target tokens after position t leaves logits <= t unchanged."""
    model = kt.Transformer(tiny_config)
    src, tgt = random_ids((2, 6)), random_ids((2, 8), seed=1)
    base = np.asarray(model((src, tgt)))
    for t in (0, 3, 6):
        changed = tgt.copy()
        changed[:, t + 1:] = random_ids((2, 8 - t - 1), seed=t + 10)
        out = np.asarray(model((src, changed)))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-5)
        assert not np.allclose(out[:, t + 1:], base[:, t + 1:])


def test_source_padding_is_invisible(tiny_config):
    model = kt.Transformer(tiny_config)
    src, tgt = random_ids((2, 6)), random_ids((2, 5), seed=1)
    padded = np.concatenate([src, np.zeros((2, 9), "int32")], axis=1)
    np.testing.assert_allclose(model((padded, tgt)), model((src, tgt)), atol=1e-5)


def test_shared_embedding_is_tied_and_layers_are_not_shared(tiny_config):
    model = kt.Transformer(tiny_config)
    model.build()
    assert model.source_embedding.token_embedding is model.target_embedding.token_embedding
    names = [w.path for w in model.weights]
    assert len(names) == len(set(names))
    kernels = [layer.self_attention.wq.kernel for layer in model.encoder.encoder_layers]
    assert kernels[0] is not kernels[1]


def test_separate_vocabularies_and_untied_projection():
    config = kt.get_config("tiny", vocab_size=30, target_vocab_size=50,
                           tie_output_projection=False)
    model = kt.Transformer(config)
    logits = model((random_ids((2, 4), high=30), random_ids((2, 3), high=50)))
    assert tuple(logits.shape) == (2, 3, 50)
    assert model.source_embedding.token_embedding is not model.target_embedding.token_embedding


def test_attention_weights_of_every_layer(tiny_config):
    model = kt.Transformer(tiny_config)
    weights = model.attention_weights(random_ids((2, 6)), random_ids((2, 4)))
    assert [tuple(w.shape) for w in weights["encoder_self"]] == [(2, 4, 6, 6)] * 2
    assert [tuple(w.shape) for w in weights["decoder_self"]] == [(2, 4, 4, 4)] * 2
    assert [tuple(w.shape) for w in weights["decoder_cross"]] == [(2, 4, 4, 6)] * 2
    for w in weights["decoder_self"]:  # causal: nothing above the diagonal
        assert np.all(np.triu(np.asarray(w)[0, 0], 1) == 0)


@pytest.mark.parametrize("options", [dict(norm_first=True), dict(position_encoding="learned",
                                                                  max_length=32)])
def test_variants_save_and_load_identically(tmp_path, options):
    config = kt.get_config("tiny", vocab_size=40, **options)
    model = kt.Transformer(config)
    inputs = (random_ids((2, 6)), random_ids((2, 5)))
    expected = model(inputs)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    assert restored.config == config
    np.testing.assert_array_equal(restored(inputs), expected)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_logits_float32(policy, tiny_config):
    keras.config.set_dtype_policy(policy)
    model = kt.Transformer(tiny_config)
    logits = model((random_ids((2, 6)), random_ids((2, 5))))
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.all(np.isfinite(logits))
    assert keras.backend.standardize_dtype(model.encoder.encoder_layers[0].self_attention.wq.kernel.dtype) == "float32"
    weights = model.attention_weights(random_ids((2, 6)), random_ids((2, 5)))
    assert keras.backend.standardize_dtype(weights["encoder_self"][0].dtype) == "float32"


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_casts_the_shared_embedding_table_once(policy, tiny_config):
    # The lookups gather float32 rows and cast those (layers/embedding.py);
    # Keras's autocast would cast the whole table at each of its three
    # reads. Only the tied projection casts it.
    import tensorflow as tf

    keras.config.set_dtype_policy(policy)
    model = kt.Transformer(tiny_config)
    model.build()
    embeddings = model.source_embedding.token_embedding.embeddings
    graph = tf.function(lambda s, t: model((s, t))).get_concrete_function(
        tf.TensorSpec((2, 6), tf.int32), tf.TensorSpec((2, 5), tf.int32)).graph
    table_casts = [op.name for op in graph.get_operations()
                   if op.type == "Cast" and op.outputs[0].shape == embeddings.shape]
    assert len(table_casts) == 1, table_casts
    # The same values as casting the table first (a cast is elementwise).
    inputs = (random_ids((2, 6)), random_ids((2, 5)))
    logits = np.asarray(model(inputs))
    embeddings._autocast = True
    np.testing.assert_array_equal(np.asarray(model(inputs)), logits)


def test_inference_projects_without_transposing_the_table(tiny_config):
    # layers/embedding.py: outside training the tied projection is
    # (E x^T)^T, since TensorFlow's CPU matmul with the table transposed is
    # several times slower for a decoding step's few rows; training keeps
    # x E^T. Same values either way, for decoding steps and whole sequences.
    import tensorflow as tf

    model = kt.Transformer(tiny_config)
    model.build()
    embedding = model.target_embedding.token_embedding
    table = embedding.embeddings.shape
    rng = np.random.default_rng(0)
    for shape in ((3, tiny_config.d_model), (2, 5, tiny_config.d_model)):
        x = rng.normal(size=shape).astype("float32")
        np.testing.assert_allclose(np.asarray(embedding.logits(x)),
                                   np.asarray(embedding.logits(x, training=True)),
                                   rtol=1e-5, atol=1e-5)

    def transposed_tables(training):
        graph = tf.function(lambda x: embedding.logits(x, training=training)).get_concrete_function(
            tf.TensorSpec((None, None, tiny_config.d_model), tf.float32)).graph
        return [op.name for op in graph.get_operations()
                if op.type == "Transpose" and op.inputs[0].shape == table]

    assert transposed_tables(training=False) == []
    assert len(transposed_tables(training=True)) == 1


def test_parameter_counts_match_the_paper():
    counts = {}
    for name, paper in (("base", 65e6), ("big", 213e6)):
        model = kt.Transformer(kt.get_config(name, vocab_size=37000))
        model.build()
        counts[name] = model.count_params()
        print(f"{name}: {counts[name]:,} parameters (paper: {paper / 1e6:.0f}M)")
        assert abs(counts[name] - paper) / paper < 0.05


def test_fit_drives_the_loss_to_zero():
    config = kt.get_config("tiny", vocab_size=24, dropout=0.0, label_smoothing=0.1)
    model = kt.Transformer(config)
    rng = np.random.default_rng(0)
    src = rng.integers(4, 24, (8, 6)).astype("int32")
    tgt = np.concatenate([src[:, ::-1], np.full((8, 1), config.eos_id)], 1).astype("int32")
    tgt_in = np.concatenate([np.full((8, 1), config.bos_id), tgt[:, :-1]], 1).astype("int32")
    tgt[:4, -2:] = config.pad_id  # some padding in the labels
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=kt.LabelSmoothedCrossEntropy(config.label_smoothing, pad_id=config.pad_id),
        metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)],
    )
    # 150 updates as 15 epochs of 10: each epoch of fit costs more than an
    # update of this model.
    batches = tf.data.Dataset.from_tensors(((src, tgt_in), tgt)).repeat()
    history = model.fit(batches, steps_per_epoch=10, epochs=15, shuffle=False, verbose=0)
    assert history.history["loss"][0] > 1.0
    assert history.history["loss"][-1] < 0.05
    assert history.history["accuracy"][-1] == 1.0


def test_loss_is_normalised_by_real_target_tokens(tiny_config):
    """compute_loss divides by the number of real tokens, not batch x length."""
    model = kt.Transformer(tiny_config)
    loss = kt.LabelSmoothedCrossEntropy(0.1, pad_id=0)
    model.compile(optimizer="adam", loss=loss)
    src, tgt_in = random_ids((2, 5)), random_ids((2, 4), seed=3)
    y = random_ids((2, 4), seed=4)
    y[0, 2:] = 0
    logits = model((src, tgt_in))
    per_token = np.asarray(loss.call(y, logits))
    expected = per_token.sum() / (y != 0).sum()
    got = model.compute_loss(y=y, y_pred=logits)
    assert float(got) == pytest.approx(expected, rel=1e-5)
    weighted = model.compute_loss(y=y, y_pred=logits, sample_weight=np.array([1.0, 0.0]))
    assert float(weighted) == pytest.approx(per_token[0].sum() / 2, rel=1e-5)


def test_rejects_malformed_inputs(tiny_config):
    model = kt.Transformer(tiny_config)
    with pytest.raises(ValueError, match="source_ids"):
        model(random_ids((2, 3)))


def generated_batches(generate):
    """A dataset of unknown length over the `test_checkpoints.batch` pairs
    that `generate()` yields."""
    return tf.data.Dataset.from_generator(generate, output_signature=(
        (tf.TensorSpec((4, 7), tf.int32), tf.TensorSpec((4, 6), tf.int32)),
        tf.TensorSpec((4, 6), tf.int32)))


def compiled_under(strategy, config, metrics=None):
    """A `kt.Transformer` compiled in the scope of `strategy` (None: no
    strategy; "OneDeviceStrategy": one on the CPU)."""
    scope = (tf.distribute.OneDeviceStrategy("/cpu:0").scope() if strategy
             else contextlib.nullcontext())
    with scope:
        model = kt.Transformer(config)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=config.pad_id),
                      metrics=metrics)
    return model


def test_fit_without_a_strategy_opens_one_training_iterator(tiny_config):
    # One layer: the iterators, not depth, are what these count.
    config = tiny_config.replace(num_layers=1)
    # Keras builds an unbuilt model while tracing the step there. A batch
    # pulled from a throwaway iterator first would take shuffle seeds from the
    # dataset's generator, which its iterators share: training would get the
    # second draw, or a later one when the throwaway's prefetch wraps round a
    # small corpus, so the order would vary with load.
    from test_checkpoints import batch

    starts = []

    def generate():
        starts.append(1)
        while True:
            yield batch(100)

    train = generated_batches(generate)
    model = compiled_under(None, config, metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    model.fit(train, steps_per_epoch=2, epochs=2, verbose=0)
    assert len(starts) == 1


@pytest.mark.parametrize("strategy", [None, "OneDeviceStrategy"])
def test_validations_read_the_validation_set_exactly_once_each(tiny_config, strategy):
    config = tiny_config.replace(num_layers=1)  # depth counts no reads
    # Once everything is built, neither fit's validations nor evaluate pull a
    # batch from a throwaway iterator: dropping such a half-read iterator can
    # stall training with every core idle.
    from test_checkpoints import batch, dataset

    batches = [batch(100 + 10 * i) for i in range(3)]
    reads = []

    def generate():
        for b in batches:
            reads.append(1)
            yield b

    validation = generated_batches(generate)
    model = compiled_under(strategy, config, metrics=[kt.MaskedAccuracy(pad_id=config.pad_id)])
    model.fit(dataset(1).repeat(), validation_data=validation, steps_per_epoch=1, epochs=3,
              verbose=0)
    assert len(reads) == 3 * len(batches)
    model.evaluate(validation, verbose=0)
    assert len(reads) == 4 * len(batches)


@pytest.mark.parametrize("strategy", [None, "OneDeviceStrategy"])
def test_fit_and_evaluate_delete_their_input_iterators_on_return(
        tiny_config, strategy, monkeypatch):
    # Keras leaves the batch generator of a stopped epoch, and of a pass over
    # data of unknown length, in a reference cycle with the tf.data
    # iterator; deleting that iterator at a later garbage collection can
    # wait up to a minute for its autotuning thread.
    import gc
    import weakref

    from tensorflow.python.data.ops import iterator_ops

    from test_checkpoints import batch, dataset

    created = []
    make = iterator_ops.OwnedIterator.__init__

    def recording(self, *args, **kwargs):
        make(self, *args, **kwargs)
        created.append(weakref.ref(self))

    monkeypatch.setattr(iterator_ops.OwnedIterator, "__init__", recording)

    def alive_after(call):
        """The iterators `call` made and how many outlive it, with no
        collection between its return and the count: only reference counting
        can delete them."""
        created.clear()
        gc.disable()
        try:
            call()
            return len(created), sum(ref() is not None for ref in created)
        finally:
            gc.enable()

    class StopAtTheSecondUpdate(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = batch == 1

    unknown_length = generated_batches(lambda: iter([batch(100), batch(110)]))
    # One layer: depth holds no iterator.
    model = compiled_under(strategy, tiny_config.replace(num_layers=1))
    made, alive = alive_after(lambda: model.fit(
        dataset(2).repeat(), validation_data=unknown_length, steps_per_epoch=5, epochs=2,
        verbose=0, callbacks=[StopAtTheSecondUpdate()]))
    assert int(model.optimizer.iterations) == 2
    assert made >= 2 and alive == 0, f"{alive} of {made} tf.data iterators outlived fit"
    made, alive = alive_after(lambda: model.evaluate(unknown_length, verbose=0))
    assert made >= 1 and alive == 0, f"{alive} of {made} tf.data iterators outlived evaluate"
