"""`kt.TrainingRun` from a script: the run directory it writes is one the
kt-* commands take, and what does not fit it is refused early, by name.
(Exact resume after kill -9 from a script: tests/test_install.py.)"""

import pytest

import keras_transformer as kt
from keras_transformer.run_directory import RunDirectory

SENTENCES = [f"the dog {i} sees a small cat" for i in range(60)]


def compiled(config):
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=config.pad_id))
    return model


@pytest.fixture
def tok():
    # Per test: the tests' seeding (conftest) destroys TensorFlow's eager
    # resources, a tokenizer's included.
    return kt.SubwordTokenizer.train(SENTENCES, vocab_size=400)


def test_a_new_run_directory_is_one_the_commands_take(tmp_path, tok):
    config = kt.get_config("tiny", tokenizer=tok)
    model = compiled(config)
    run = kt.TrainingRun(tmp_path / "run", model, tokenizer=tok)
    directory = RunDirectory(str(tmp_path / "run"))
    assert directory.exists() and directory.load_config() == config
    source, target = directory.load_tokenizers()
    assert source.model_proto == tok.model_proto and target is source
    batches = kt.data.translation_dataset([(s, s) for s in SENTENCES], tok, batch_tokens=256,
                                          max_length=32)
    model.fit(batches, epochs=1, verbose=0, callbacks=run.callbacks(checkpoint_every=0))
    prefix, _ = directory.resolve_checkpoint("last")
    assert prefix.endswith(f"ckpt-{run.step}") and run.step > 0
    translator = kt.Translator(directory.load_model(), tok)
    assert len(translator.translate(["the dog sees a cat"])[0]) == 1


def test_what_does_not_fit_the_run_is_refused(tmp_path, tok):
    with pytest.raises(ValueError, match=r"needs a compiled model"):
        kt.TrainingRun(tmp_path / "a", kt.Transformer(kt.get_config("tiny", tokenizer=tok)))
    kt.TrainingRun(tmp_path / "a", compiled(kt.get_config("tiny", tokenizer=tok)), tokenizer=tok)
    other = compiled(kt.get_config("tiny", tokenizer=tok, num_layers=1))
    with pytest.raises(ValueError, match=r"holds a model with other settings: .*num_layers"):
        kt.TrainingRun(tmp_path / "a", other, tokenizer=tok)
    wrong_size = compiled(kt.get_config("tiny", vocab_size=tok.vocab_size + 5))
    with pytest.raises(ValueError, match=r"tokenizer has \d+ ids but the model's config says"):
        kt.TrainingRun(tmp_path / "b", wrong_size, tokenizer=tok)


def test_resumed_run_reports_its_step_and_data_position(tmp_path, tok):
    config = kt.get_config("tiny", tokenizer=tok)
    model = compiled(config)
    run = kt.TrainingRun(tmp_path / "run", model, tokenizer=tok)
    batches = kt.data.translation_dataset([(s, s) for s in SENTENCES], tok, batch_tokens=128,
                                          max_length=32, repeat=True, seed=1)
    model.fit(batches, steps_per_epoch=3, epochs=2, verbose=0,
              callbacks=run.callbacks(train_steps=5, checkpoint_every=2))
    again = kt.TrainingRun(tmp_path / "run", compiled(config), tokenizer=tok)
    assert again.restored.endswith("ckpt-5")
    assert (again.step, again.data_position, again.skip_batches) == (5, 5, 5)
    assert again.initial_epoch(3) == 1
    assert kt.weights_digest(again.model) == kt.weights_digest(model)


def test_a_signal_stops_fit_at_the_next_update_with_a_checkpoint(tmp_path, tok):
    import signal
    import threading

    import keras
    import tensorflow as tf

    from keras_transformer.training.checkpoints import StepCheckpoint

    seen = []

    def script_handler(number, frame):  # the script's own: a second signal reaches it
        seen.append(number)

    before = signal.signal(signal.SIGINT, script_handler)
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        class Interrupt(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    signal.raise_signal(signal.SIGINT)
                    signal.raise_signal(signal.SIGINT)

        config = kt.get_config("tiny", tokenizer=tok)
        model = compiled(config)
        run = kt.TrainingRun(tmp_path / "run", model, tokenizer=tok)
        batches = kt.data.translation_dataset([(s, s) for s in SENTENCES], tok,
                                              batch_tokens=128, max_length=32, repeat=True,
                                              seed=1)
        model.fit(batches, steps_per_epoch=3, epochs=2, verbose=0,
                  callbacks=[Interrupt(), *run.callbacks(checkpoint_every=0)])
        assert run.interrupted == "SIGINT" and run.step == 2 and seen == [signal.SIGINT]
        assert tf.train.latest_checkpoint(run.run.checkpoint_dir).endswith("ckpt-2")
        assert signal.getsignal(signal.SIGINT) is script_handler
        assert signal.getsignal(signal.SIGTERM) is sigterm
        again = kt.TrainingRun(tmp_path / "run", compiled(config), tokenizer=tok)
        assert (again.step, again.data_position) == (2, 2)
        assert kt.weights_digest(again.model) == kt.weights_digest(model)

        # Only the main thread may install handlers: elsewhere, none.
        handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        callback = StepCheckpoint(again.writer, 0, stop_signals=(signal.SIGTERM, signal.SIGINT))
        thread = threading.Thread(target=callback.on_train_begin)
        thread.start()
        thread.join()
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers
    finally:
        signal.signal(signal.SIGINT, before)
