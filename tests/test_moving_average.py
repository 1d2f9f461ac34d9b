"""An exponential moving average of the weights (`use_ema=True` on the
optimizer, `kt-train --ema DECAY`): validation and the best checkpoints see
the average, training goes on from its own weights, and a resumed run
continues the average."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.cli.train import build_parser, training_config
from keras_transformer.run_directory import RunDirectory
from keras_transformer.training.moving_average import moving_average_optimizer
from support.processes import write_corpus

SENTENCES = [f"the dog {i} sees a small cat" for i in range(60)]


def compiled(config, **ema):
    model = kt.Transformer(config)
    model.compile(optimizer=kt.transformer_adam(config.d_model, warmup_steps=4, **ema),
                  loss=kt.LabelSmoothedCrossEntropy(pad_id=config.pad_id))
    return model


def averages(model):
    return [np.array(a) for a in moving_average_optimizer(
        model.optimizer)._model_variables_moving_average]


class Record(keras.callbacks.Callback):
    """The model's weights as every callback before it left them."""

    def __init__(self):
        super().__init__()
        self.at_epoch_end = []

    def on_epoch_end(self, epoch, logs=None):
        self.at_epoch_end.append(kt.weights_digest(self.model))


def fit(with_callback, seed=3):
    keras.utils.set_random_seed(seed)
    config = kt.get_config("tiny", vocab_size=40, dropout=0.1, num_layers=1)
    model = compiled(config, use_ema=True, ema_momentum=0.8)
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 40, size=(16, 7)).astype("int32")
    val = rng.integers(4, 40, size=(8, 7)).astype("int32")
    record = Record()
    callbacks = [record]
    if with_callback:
        average = kt.ValidateMovingAverage(model.optimizer)
        callbacks = [average, record, average.restore]
    history = model.fit((ids, ids), ids, batch_size=4, epochs=3, verbose=0,
                        validation_data=((val, val), val), callbacks=callbacks, shuffle=False)
    return model, history.history["val_loss"], record.at_epoch_end, (val, val), val


def test_validation_sees_the_average_and_training_is_unchanged():
    model, val_losses, seen, x, y = fit(with_callback=True)
    plain, plain_losses, plain_seen, _, _ = fit(with_callback=False)
    # Swapping in and out is exact: the same training, the same final model
    # (`fit` ends by copying the average into the model).
    assert kt.weights_digest(model) == kt.weights_digest(plain)
    # The callbacks between saw the average, not the training weights.
    assert all(a != b for a, b in zip(seen, plain_seen))
    assert seen[-1] == kt.weights_digest(model)
    # The last validation scored the average, which the model now holds.
    final = model.evaluate(x, y, verbose=0)
    tolerance = 1e-6 * max(1.0, abs(final))  # float32 rounding
    assert abs(val_losses[-1] - final) <= 10 * tolerance
    assert all(abs(a - b) > 100 * tolerance for a, b in zip(val_losses, plain_losses))


def test_a_run_keeps_the_average_as_its_best_checkpoint_and_resumes_it(tmp_path):
    tok = kt.SubwordTokenizer.train(SENTENCES, vocab_size=400)
    config = kt.get_config("tiny", tokenizer=tok, num_layers=1)
    model = compiled(config, use_ema=True, ema_momentum=0.9)
    run = kt.TrainingRun(tmp_path / "run", model, tokenizer=tok)
    pairs = [(s, s) for s in SENTENCES]
    train = kt.data.translation_dataset(pairs, tok, batch_tokens=128, max_length=32,
                                        repeat=True, seed=1)
    valid = kt.data.translation_dataset(pairs[:10], tok, batch_tokens=128, max_length=32)
    callbacks = run.callbacks(train_steps=4, checkpoint_every=2, keep_best=1,
                              best_metric="loss")
    assert isinstance(callbacks[0], kt.ValidateMovingAverage)
    assert callbacks[-1] is callbacks[0].restore
    model.fit(train, validation_data=valid, steps_per_epoch=4, epochs=1, verbose=0, shuffle=False,
              callbacks=callbacks)
    assert callbacks[0].validated == [4]
    # best/ holds the average at step 4, which `fit` left in the model.
    directory = RunDirectory(str(tmp_path / "run"))
    prefix, _ = directory.resolve_checkpoint("best")
    assert prefix.endswith("ckpt-4")
    assert kt.weights_digest(directory.load_model(prefix)) == kt.weights_digest(model)
    # The step checkpoint holds the training weights and the average.
    again = kt.TrainingRun(tmp_path / "run", compiled(config, use_ema=True, ema_momentum=0.9),
                           tokenizer=tok)
    assert again.restored.endswith("ckpt-4")
    for restored, kept in zip(averages(again.model), averages(model)):
        np.testing.assert_array_equal(restored, kept)
    assert kt.weights_digest(again.model) != kt.weights_digest(model)


def test_an_optimizer_without_an_average_gets_no_swap(tmp_path):
    model = compiled(kt.get_config("tiny", vocab_size=40))
    with pytest.raises(ValueError, match=r"use_ema=True \(kt-train --ema DECAY\)"):
        kt.ValidateMovingAverage(model.optimizer)
    callbacks = kt.TrainingRun(tmp_path / "run", model).callbacks(keep_best=1)
    assert not any(isinstance(c, kt.ValidateMovingAverage) for c in callbacks)


@pytest.mark.parametrize("argv, expected", [([], 0.0), (["--ema", "0.999"], 0.999),
                                            (["--set", "ema=0.99"], 0.99)])
def test_kt_train_ema_is_a_setting(argv, expected):
    parser = build_parser()
    argv = ["--run-dir", "r", "--data", "builtin", "--src-lang", "en", "--tgt-lang", "synth",
            *argv]
    settings = training_config(parser.parse_args(argv), argv)
    settings.validate()
    assert settings.ema == expected


def test_kt_train_ema_trains_and_ends_with_the_average(tmp_path):
    from keras_transformer.cli import train as trainer

    data = tmp_path / "data"
    data.mkdir()
    write_corpus(str(data))
    args = trainer.build_parser().parse_args([
        "--run-dir", str(tmp_path / "run"), "--data", f"text:{data}", "--src-lang", "en",
        "--tgt-lang", "de", "--config", "tiny", "--vocab-size", "400", "--train-steps", "2",
        "--steps-per-epoch", "2", "--checkpoint-every", "0", "--warmup-steps", "4",
        "--batch-tokens", "256", "--max-length", "10", "--valid-split", "val",
        "--bleu-sentences", "0", "--keep-best", "1", "--best-metric", "loss", "--verbose", "0",
        "--ema", "0.9"])
    model = trainer.train(args)
    optimizer = moving_average_optimizer(model.optimizer)
    assert optimizer.ema_momentum == pytest.approx(0.9)
    for weight, average in zip(optimizer._trainable_variables, averages(model)):
        np.testing.assert_array_equal(np.array(weight), average)
    best, _ = RunDirectory(str(tmp_path / "run")).resolve_checkpoint("best")
    assert kt.weights_digest(RunDirectory(str(tmp_path / "run")).load_model(best)) == \
        kt.weights_digest(model)


@pytest.mark.parametrize("value", ["1", "-0.1", "nan"])
def test_kt_train_ema_out_of_range_is_named(value):
    parser = build_parser()
    argv = ["--run-dir", "r", "--data", "builtin", "--src-lang", "en", "--tgt-lang", "synth",
            "--ema", value]
    with pytest.raises(ValueError, match=r"--ema must be in \[0, 1\)"):
        training_config(parser.parse_args(argv), argv).validate()
