"""Best validated checkpoints, early stopping and validation BLEU
(keras_transformer/training/selection.py). The callbacks are driven with
hand-written validation logs and the optimizer step set by hand, except in
the `fit` test."""

import json
import os
import types

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_directory import RunDirectory
from keras_transformer.training import selection
from keras_transformer.training.checkpoints import build_for_restore
from keras_transformer.training.selection import BestCheckpoints, ValidationBleu
from test_checkpoints import dataset
from test_run_directory import set_weights, weights


@pytest.fixture
def trained(tmp_path, tiny_config):
    """`(run, model)`: a run directory and a compiled model whose optimizer
    step the tests set."""
    run = RunDirectory(str(tmp_path / "run"))
    run.save_config(tiny_config)
    model = kt.Transformer(tiny_config)
    optimizer = kt.transformer_adam(tiny_config.d_model, warmup_steps=10)
    model.compile(optimizer=optimizer,
                  loss=kt.LabelSmoothedCrossEntropy(0.1, pad_id=tiny_config.pad_id))
    build_for_restore(model, optimizer)
    return run, model


def validate(callback, model, step, value, metric="bleu", loss=1.0):
    """One validation at `step` with weights `set_weights(model, step)`."""
    model.optimizer.iterations.assign(step)
    set_weights(model, step)
    logs = {"val_loss": value if metric == "loss" else loss}
    if metric == "bleu":
        logs["val_bleu"] = value
    callback.on_epoch_end(step // 10, logs)
    return model.stop_training


def files(run):
    return sorted(f for f in os.listdir(run.best_dir) if f.startswith("ckpt-"))


def index(run):
    with open(os.path.join(run.best_dir, "index.json")) as f:
        return json.load(f)


VALUES = [10.0, 30.0, 20.0, 40.0, 5.0, 35.0]  # at steps 10, 20, ..., 60


@pytest.mark.parametrize("metric, expected", [
    ("bleu", [(40, 40.0), (60, 35.0), (20, 30.0)]),  # higher is better
    ("loss", [(50, 5.0), (10, 10.0), (30, 20.0)]),   # lower is better
])
def test_keeps_exactly_the_best_k_and_deletes_the_others(trained, metric, expected):
    run, model = trained
    callback = BestCheckpoints(model, run, metric=metric, keep=3)
    for i, value in enumerate(VALUES):
        validate(callback, model, 10 * (i + 1), value, metric)
    assert [(step, value) for _, step, value in run.best_checkpoints()] == expected
    assert run.best_checkpoints().metric == metric
    kept = sorted(f"ckpt-{step}" for step, _ in expected)
    assert sorted({f.split(".")[0] for f in files(run)}) == kept
    assert all(any(f.startswith(name + ".index") for f in files(run)) for name in kept)
    assert [e["step"] for e in index(run)["history"]] == [10, 20, 30, 40, 50, 60]
    # The saved weights are the model's at that validation.
    best_step = expected[0][0]
    loaded = run.load_model("best", quiet=True)
    set_weights(model, best_step)
    for a, b in zip(weights(loaded), weights(model)):
        np.testing.assert_array_equal(a, b)
    assert not model.stop_training


def test_patience_stops_at_the_right_validation(trained, capsys):
    run, model = trained
    callback = BestCheckpoints(model, run, metric="bleu", keep=1, patience=3)
    # 12 at step 20 is the best; 11, 11.5 and an equal 12 do not improve on it.
    for step, value in [(10, 10.0), (20, 12.0), (30, 11.0), (40, 11.5)]:
        assert not validate(callback, model, step, value)
    assert callback.validations_without_improvement == 2
    assert validate(callback, model, 50, 12.0)
    assert callback.stopped_at_step == 50
    out = capsys.readouterr().out
    assert "Stopping early at step 50" in out and "12.00 (step 20)" in out
    assert callback.summary() == (
        "Best validation BLEU 12.00 at step 20 after 5 validations; best/ keeps ckpt-20. "
        "Stopped early at step 50: 3 validations without improvement "
        "(--early-stopping-patience 3).")


def test_loss_patience_and_an_improvement_resets_the_count(trained):
    run, model = trained
    callback = BestCheckpoints(model, run, metric="loss", keep=2, patience=2)
    assert not validate(callback, model, 10, 2.0, "loss")
    assert not validate(callback, model, 20, 2.1, "loss")
    assert not validate(callback, model, 30, 1.9, "loss")  # improves: count back to 0
    assert not validate(callback, model, 40, 1.95, "loss")
    assert validate(callback, model, 50, 1.9, "loss")
    assert callback.stopped_at_step == 50


def test_resume_continues_the_best_set_and_the_patience_count(tmp_path, trained, tiny_config):
    run, model = trained
    sequence = [(10, 10.0), (20, 12.0), (30, 11.0), (40, 11.5), (50, 12.5), (60, 12.0),
                (70, 12.1), (80, 12.4)]
    first = BestCheckpoints(model, run, metric="bleu", keep=2, patience=3)
    stops = [validate(first, model, s, v) for s, v in sequence[:4]]
    # A new process on the same run directory.
    second = BestCheckpoints(model, run, metric="bleu", keep=2, patience=3)
    assert second.validations_without_improvement == 2
    assert [e["step"] for e in second.best] == [20, 40]
    stops += [validate(second, model, s, v) for s, v in sequence[4:]]

    # The same as one uninterrupted process.
    other = RunDirectory(str(tmp_path / "other"))
    other.save_config(tiny_config)
    model.stop_training = False
    single = BestCheckpoints(model, other, metric="bleu", keep=2, patience=3)
    expected = [validate(single, model, s, v) for s, v in sequence]
    assert stops == expected == [False] * 7 + [True]
    assert index(run) == index(other)
    assert [(s, v) for _, s, v in run.best_checkpoints()] == [(50, 12.5), (80, 12.4)]
    assert files(run) == files(other)
    # Once stopped, a new process knows it has nothing to do.
    assert not BestCheckpoints(model, run, metric="bleu", keep=2).should_stop()
    stopped = BestCheckpoints(model, run, metric="bleu", keep=2, patience=3)
    assert stopped.should_stop() and stopped.stopped_at_step == 80
    assert "Stopped early at step 80" in stopped.summary()
    assert not BestCheckpoints(model, run, metric="bleu", keep=2, patience=4).should_stop()


def test_a_crash_leaves_an_index_of_complete_checkpoints(trained, monkeypatch):
    run, model = trained
    callback = BestCheckpoints(model, run, metric="bleu", keep=1)
    validate(callback, model, 10, 10.0)

    # Killed after writing the checkpoint files, before the index.
    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(selection, "write_atomically", crash)
    with pytest.raises(KeyboardInterrupt):
        validate(callback, model, 20, 20.0)
    monkeypatch.undo()
    assert any(f.startswith("ckpt-20.") for f in files(run))
    assert [s for _, s, _ in run.best_checkpoints()] == [10]
    assert run.resolve_checkpoint("best")[0].endswith("best/ckpt-10")

    # Killed after the index, before deleting the checkpoint that dropped out.
    restarted = BestCheckpoints(model, run, metric="bleu", keep=1)
    assert {f.split(".")[0] for f in files(run)} == {"ckpt-10"}  # leftovers removed
    monkeypatch.setattr(BestCheckpoints, "_delete", lambda self, name: crash())
    with pytest.raises(KeyboardInterrupt):
        validate(restarted, model, 30, 30.0)
    monkeypatch.undo()
    assert [s for _, s, _ in run.best_checkpoints()] == [30]
    BestCheckpoints(model, run, metric="bleu", keep=1)
    assert {f.split(".")[0] for f in files(run)} == {"ckpt-30"}
    assert [e["step"] for e in index(run)["history"]] == [10, 30]


def test_missing_metric_and_changed_metric_are_clear_errors(trained):
    run, model = trained
    callback = BestCheckpoints(model, run, metric="bleu", keep=1)
    model.optimizer.iterations.assign(10)
    with pytest.raises(ValueError, match="--bleu-sentences"):
        callback.on_epoch_end(0, {"val_loss": 1.0})
    with pytest.raises(ValueError, match="--valid-split"):
        BestCheckpoints(model, run, metric="loss", keep=1).on_epoch_end(0, {"loss": 1.0})
    validate(callback, model, 10, 10.0)
    with pytest.raises(ValueError, match="--best-metric bleu"):
        BestCheckpoints(model, run, metric="loss", keep=1)
    with pytest.raises(ValueError, match="--keep-best"):
        BestCheckpoints(model, run, keep=0)


def test_a_non_chief_worker_writes_nothing_but_decides_the_same(trained):
    run, model = trained
    resolver = types.SimpleNamespace(
        task_type="worker", task_id=1,
        cluster_spec=lambda: types.SimpleNamespace(as_dict=lambda: {"worker": ["a", "b"]}))
    worker = BestCheckpoints(model, run, metric="bleu", keep=1, patience=1,
                             strategy=types.SimpleNamespace(cluster_resolver=resolver))
    assert not validate(worker, model, 10, 10.0)
    assert validate(worker, model, 20, 9.0)
    assert os.listdir(run.best_dir) == []  # its scratch directory is gone too
    assert [e["step"] for e in worker.best] == [10]


def test_validation_bleu_feeds_best_checkpoints_in_fit(trained, capsys):
    run, model = trained
    references = ["a b c d e", "f g h i j"]
    # Perfect, then worse and worse: BLEU 100 at the first validation only.
    outputs = iter([references, ["a b c d x", "f g h i j"], ["a b x d x", "f x h i j"],
                    ["x", "y"]])
    bleu = ValidationBleu(lambda sources: next(outputs), ["1", "2"], references,
                          log_dir=run.log_dir)
    best = BestCheckpoints(model, run, metric="bleu", keep=2, patience=2)
    model.fit(dataset(1).repeat(), validation_data=dataset(1), steps_per_epoch=1, epochs=10,
              verbose=0, shuffle=False, callbacks=[bleu, best])
    steps = [e["step"] for e in index(run)["history"]]
    assert len(steps) == 3 and best.stopped_at_step == steps[-1]  # stopped by patience
    history = index(run)["history"]
    assert history[0]["bleu"] == pytest.approx(100.0)
    assert all(e["loss"] is not None for e in history)
    assert [s for _, s, _ in run.best_checkpoints()] == steps[:2]
    assert [s for s, _ in bleu.history] == steps
    out = capsys.readouterr().out
    assert f"Step {steps[0]}: validation BLEU 100.00 (2 sentences)" in out
    assert tf.io.gfile.glob(os.path.join(run.log_dir, "events.out.tfevents.*"))
